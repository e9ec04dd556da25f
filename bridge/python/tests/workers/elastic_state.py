"""gocoll.elastic with a killed rank: 8 virtual devices over the ranks
train a vector with momentum from per-device gradients that depend only on
(seed, device, step); rank VICTIM (if any) SIGKILLs itself at step KILL_AT
(after its update: it may be a step ahead of the others, or behind). Every
survivor reports the sha256 of its final state and what recovered.

Other modes (environment):
  STOP=r,s,AT   ranks r and s SIGSTOP themselves before step AT (silent past
                the timeout); the others report the error their recovery
                ends with, then SIGKILL the stopped ones (their pids were
                all-gathered at the start).
  JOB_FILE      admit replacements through this job file; WAIT_JOINER_AT=n:
                unless one was admitted or refused by then, rank 0 waits at
                step n until a process asks to join.
  ROLE=join     a replacement with NDEV devices (default 8) joining through
                JOB_FILE; it reports the error it was refused with, if any.
  ZOMBIE=1      after the start, rank 0 writes another view into JOB_FILE
                (as other ranks that went on without these would); every
                rank's next publish must raise Superseded."""

import hashlib
import os
import signal
import time

import numpy as np

import gocoll
import gocoll.elastic
from common import main, report

NDEV, N, STEPS = 8, 4096, 40


def grad(params, dev, step):
    rng = np.random.default_rng([7, dev, step])
    return rng.standard_normal(N) * (1 + dev) + 0.01 * params


def loop(me, hook):
    @gocoll.elastic.run
    def train(state):
        while state.step < STEPS:
            hook(state)
            grads = [grad(state.params, d, state.step) for d in state.devices]
            state.vcomm.allreduce(grads, op="avg")
            state.momentum *= 0.9
            state.momentum += grads[0]
            state.params -= 0.01 * state.momentum
            state.commit()
            if me == int(os.environ.get("VICTIM", "-1")) and state.step == int(os.environ.get("KILL_AT", "-1")):
                os.kill(os.getpid(), signal.SIGKILL)
    return train


def finish(state, extra=None):
    h = hashlib.sha256(state.params.tobytes() + state.momentum.tobytes()).hexdigest()
    out = {"sha256": h, "recoveries": state.recoveries, "ranks": state.comm.size, "devices": state.devices}
    out.update(extra or {})
    report(out)
    state.close()
    state.comm.destroy()


def joiner():
    ndev = int(os.environ.get("NDEV", str(NDEV)))
    try:
        state = gocoll.elastic.State.join(os.environ["JOB_FILE"], ndev, timeout=60,
                                          params=np.zeros(N), momentum=np.zeros(N))
    except gocoll.Error as e:
        report({"error": type(e).__name__, "detail": str(e)})
        return
    loop(state.comm.rank, lambda s: None)(state)
    finish(state)


def zombie(comm, state):
    """Another view of the job appears in the job file (the others went on
    without these ranks); their next publish must stop them all."""
    path = os.environ["JOB_FILE"]
    comm.barrier()
    if comm.rank == 0:
        with open(path, "w") as f:
            f.write("gocoll-join:1:00ff:127.0.0.1:1\npids 1 2\nepoch 7\n")
    comm.barrier()
    with open(path) as f:
        other = f.read()
    try:
        state._publish()
        got = "published"
    except gocoll.elastic.Superseded as e:
        got = type(e).__name__ + (" (an Excluded)" if isinstance(e, gocoll.Excluded) else "")
    with open(path) as f:
        report({"publish": got, "file_unchanged": f.read() == other})


def work():
    if os.environ.get("ROLE") == "join":
        return joiner()
    comm = gocoll.init()
    me = comm.rank
    pids = [np.zeros(1, np.int64) for _ in range(comm.size)]
    comm.all_gather(pids, np.array([os.getpid()], np.int64))
    params, momentum = np.zeros(N), np.zeros(N)
    state = gocoll.elastic.State(comm, NDEV, min_ranks=2, job_file=os.environ.get("JOB_FILE"),
                                 params=params, momentum=momentum)
    if os.environ.get("ZOMBIE"):
        return zombie(comm, state)
    stop = [int(x) for x in os.environ.get("STOP", "").split(",") if x]
    wait_at = int(os.environ.get("WAIT_JOINER_AT", "-1"))

    def hook(s):
        nonlocal wait_at
        if stop and me in stop[:-1] and s.step == stop[-1]:
            os.kill(os.getpid(), signal.SIGSTOP)
        if s.step >= wait_at >= 0:
            # Once: the joiner may have been admitted (or refused) before.
            wait_at = -1
            deadline = time.monotonic() + 20  # less than GOCOLL_TIMEOUT: the others wait in the allreduce
            while s.comm.rank == 0 and not s.recoveries and s.comm.joiners() < 1 and time.monotonic() < deadline:
                time.sleep(0.01)

    try:
        loop(me, hook)(state)
    except gocoll.Error as e:
        if not stop:
            raise
        for r in stop[:-1]:
            try:
                os.kill(int(pids[r][0]), signal.SIGKILL)  # stopped, and never resumed
            except ProcessLookupError:
                pass  # another survivor killed it first
        report({"error": type(e).__name__, "peer_failure": isinstance(e, gocoll.PEER_FAILURES),
                "recoveries": state.recoveries})
        return
    finish(state)


if __name__ == "__main__":
    main(work)
