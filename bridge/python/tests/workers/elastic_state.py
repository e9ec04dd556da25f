"""gocoll.elastic with a killed rank: 8 virtual devices over the ranks
train a vector with momentum from per-device gradients that depend only on
(seed, device, step); rank VICTIM (if any) SIGKILLs itself at step KILL_AT
(after its update: it may be a step ahead of the others, or behind). Every
survivor reports the sha256 of its final state and what recovered."""

import hashlib
import os
import signal

import numpy as np

import gocoll
import gocoll.elastic
from common import main, report

NDEV, N, STEPS = 8, 4096, 40


def grad(params, dev, step):
    rng = np.random.default_rng([7, dev, step])
    return rng.standard_normal(N) * (1 + dev) + 0.01 * params


def work():
    victim = int(os.environ.get("VICTIM", "-1"))
    kill_at = int(os.environ.get("KILL_AT", "-1"))
    comm = gocoll.init()
    me = comm.rank
    params, momentum = np.zeros(N), np.zeros(N)
    state = gocoll.elastic.State(comm, NDEV, min_ranks=2, params=params, momentum=momentum)

    @gocoll.elastic.run
    def train(state):
        while state.step < STEPS:
            grads = [grad(state.params, d, state.step) for d in state.devices]
            state.vcomm.allreduce(grads, op="avg")
            state.momentum *= 0.9
            state.momentum += grads[0]
            state.params -= 0.01 * state.momentum
            state.commit()
            if me == victim and state.step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

    train(state)
    h = hashlib.sha256(state.params.tobytes() + state.momentum.tobytes()).hexdigest()
    report({"sha256": h, "recoveries": state.recoveries, "ranks": state.comm.size, "devices": state.devices})
    state.close()
    state.comm.destroy()


if __name__ == "__main__":
    main(work)
