"""Training loops that survive a lost rank, on virtual devices.

The shape of Horovod's ``hvd.elastic.run`` + ``State``, with nothing to
re-average: the state lives on ``ndev`` virtual devices
(:class:`gocoll.vppu.VirtualComm`), every reduction folds the devices in
order, so when a rank process dies the survivors shrink the communicator,
re-place its devices on themselves with the state copied from a live
holder, settle the step in flight, and go on to the weights an
uninterrupted run would have produced::

    state = gocoll.elastic.State(comm, ndev=8, params=w, momentum=m)

    @gocoll.elastic.run
    def train(state):
        while state.step < steps:
            grads = [grad(state.params, dev, state.step) for dev in state.devices]
            state.vcomm.allreduce(grads, op="avg")
            update(state.params, state.momentum, grads[0])   # in place
            state.commit()                                   # step += 1

    train(state)

What the loop must keep for the guarantee: the registered arrays are the
whole state and are updated in place, only from the reduced result; a
device's data and randomness depend only on (seed, device, step), never on
which process hosts it nor on thread counts; ``commit`` comes after the
update.
"""

import time

from .errors import PEER_FAILURES
from .vppu import VirtualComm

MAX_ATTEMPTS = 8  # shrink+recover rounds of one recovery (one per lost process at most)


class State:
    """Named numpy arrays (or torch CPU tensors) that every virtual device
    holds alike, registered shared on a :class:`VirtualComm` of ``ndev``
    devices over ``comm``, and the step count. Attributes: ``comm``,
    ``vcomm``, ``step``, ``devices`` (local), the arrays by name, and
    ``recoveries`` (a dict per recovery: ``step``, ``resumed``, ``lost``,
    ``ranks``, ``seconds``)."""

    def __init__(self, comm, ndev, topology="ring", min_ranks=0, **arrays):
        self.comm = comm
        self.vcomm = VirtualComm(comm, topology, ndev)
        self.min_ranks = min_ranks
        self.step = 0
        self.recoveries = []
        self._names = sorted(arrays)
        for name in self._names:
            self.vcomm.register_shared(name, arrays[name])
            setattr(self, name, arrays[name])

    @property
    def devices(self):
        return self.vcomm.devices

    def commit(self):
        """One step done: call it after the update of the arrays."""
        self.step += 1

    def recover(self, cause=None):
        """The survivors' side of a lost rank: shrink (agreeing on who is
        gone), re-place the devices, settle the step. Every surviving rank
        calls it (``run`` does)."""
        start = time.monotonic()
        lost, errors = [], []
        for _ in range(MAX_ATTEMPTS):
            old = self.comm
            new = old.shrink()
            lost += old.failed()
            self.comm = new
            try:
                agreed = self.vcomm.recover(new, self.step, min_ranks=self.min_ranks)
            except PEER_FAILURES as e:  # another rank died meanwhile: again
                errors.append(e)
                continue
            finally:
                old.destroy()
            self.recoveries.append({"step": self.step, "resumed": agreed, "lost": lost, "ranks": new.size,
                                    "seconds": time.monotonic() - start, "cause": repr(cause)})
            self.step = agreed
            return agreed
        raise RuntimeError("gocoll.elastic: %d recoveries failed: %r" % (MAX_ATTEMPTS, errors))

    def close(self):
        self.vcomm.close()


def run(func):
    """Wrap ``func(state, *args, **kwargs)``: when a collective raises one
    of ``gocoll.PEER_FAILURES`` the survivors recover ``state`` and call
    ``func`` again, which resumes at ``state.step``."""

    def wrapper(state, *args, **kwargs):
        while True:
            try:
                return func(state, *args, **kwargs)
            except PEER_FAILURES as e:
                state.recover(e)

    wrapper.__name__ = getattr(func, "__name__", "run")
    wrapper.__doc__ = func.__doc__
    return wrapper
