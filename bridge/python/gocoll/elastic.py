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

import os
import time

import numpy as np

from .errors import PEER_FAILURES
from .vppu import VirtualComm

MAX_ATTEMPTS = 8  # shrink+recover rounds of one recovery (one per lost process at most)


class State:
    """Named numpy arrays (or torch CPU tensors) that every virtual device
    holds alike, registered shared on a :class:`VirtualComm` of ``ndev``
    devices over ``comm``, and the step count. Attributes: ``comm``,
    ``vcomm``, ``step``, ``devices`` (local), the arrays by name, and
    ``recoveries`` (a dict per recovery: ``step``, ``resumed``, ``lost``,
    ``ranks``, ``seconds``).

    ``job_file``: admit replacement processes. Rank 0 keeps the
    communicator's join info and its members' pids there; each
    :meth:`commit` tells every rank how many processes wait to join (one
    small allreduce), and they are admitted then. A replacement calls
    :meth:`join` with the same file, ``ndev`` and arrays (as templates)."""

    def __init__(self, comm, ndev, topology="ring", min_ranks=0, job_file=None, **arrays):
        self.comm = comm
        self.vcomm = VirtualComm(comm, topology, ndev)
        self._setup(ndev, topology, min_ranks, job_file, arrays)
        for name in self._names:
            self.vcomm.register_shared(name, arrays[name])
            setattr(self, name, arrays[name])
        self._publish()

    def _setup(self, ndev, topology, min_ranks, job_file, arrays):
        self.ndev, self.topology, self.min_ranks, self.job_file = ndev, topology, min_ranks, job_file
        self.step = 0
        self.recoveries = []
        self._names = sorted(arrays)

    @classmethod
    def join(cls, job_file, ndev, topology="ring", min_ranks=0, replaces=None, timeout=300, **arrays):
        """A replacement process joins the job of ``job_file`` (written by
        its rank 0) once the file no longer lists the pid ``replaces`` (the
        process it replaces), is admitted at a step boundary and receives
        devices and the state, copied into ``arrays``. Needs the job's
        GOCOLL_SECRET."""
        from .comm import join as join_comm
        self = cls.__new__(cls)
        self._setup(ndev, topology, min_ranks, job_file, arrays)
        deadline, last = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            try:
                with open(job_file) as f:
                    info, pids = f.read().split("\n")[:2]
                if replaces is not None and str(replaces) in pids.split()[1:]:
                    raise OSError("the job has not yet recovered from the death of pid %s" % replaces)
                self.comm = join_comm(info)
                break
            except (OSError, ValueError) + PEER_FAILURES as e:
                last = e
                time.sleep(0.02)
        else:
            raise RuntimeError("gocoll.elastic: could not join through %s: %r" % (job_file, last))
        self.vcomm, self.step = VirtualComm.join(self.comm, topology, ndev, min_ranks=min_ranks)
        dev = self.vcomm.devices[0]
        for name in self._names:
            a = arrays[name]
            src = self.vcomm.buffer(dev, name)
            _bytes(a)[:] = src
            self.vcomm.register_shared(name, a)  # the library's copy is freed with the next move
            setattr(self, name, a)
        self._publish()
        return self

    def _publish(self):
        """Collective (when admitting replacements): rank 0 writes the join
        info and the members' pids to the job file, atomically."""
        if not self.job_file:
            return
        mine = np.array([os.getpid()], np.int64)
        pids = [np.zeros(1, np.int64) for _ in range(self.comm.size)]
        self.comm.all_gather(pids, mine)
        if self.comm.rank == 0:
            tmp = self.job_file + ".tmp"
            with open(tmp, "w") as f:
                f.write("%s\npids %s\n" % (self.comm.join_info(), " ".join(str(int(p[0])) for p in pids)))
            os.replace(tmp, self.job_file)

    @property
    def devices(self):
        return self.vcomm.devices

    def commit(self):
        """One step done: call it after the update of the arrays. With a
        job file, processes waiting to join are admitted here."""
        self.step += 1
        if not self.job_file:
            return
        n = np.array([self.comm.joiners() if self.comm.rank == 0 else 0], np.int64)
        self.comm.all_reduce(n)
        if n[0] > 0:
            old = self.comm
            self.comm = old.grow(int(n[0]))
            self.vcomm.recover(self.comm, self.step, min_ranks=self.min_ranks)
            old.destroy()
            self._publish()

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
            self._publish()
            return agreed
        raise RuntimeError("gocoll.elastic: %d recoveries failed: %r" % (MAX_ATTEMPTS, errors))

    def close(self):
        self.vcomm.close()


def _bytes(a):
    """A flat uint8 view of a contiguous numpy array or torch CPU tensor."""
    arr = a if isinstance(a, np.ndarray) else a.numpy()
    return arr.reshape(-1).view(np.uint8)


def run(func):
    """Wrap ``func(state, *args, **kwargs)``: when a collective raises one
    of ``gocoll.PEER_FAILURES`` the survivors recover ``state`` and call
    ``func`` again, which resumes at ``state.step``."""

    def wrapper(state, *args, **kwargs):
        while True:
            try:
                return func(state, *args, **kwargs)
            except PEER_FAILURES as e:
                cause = e
            for _ in range(MAX_ATTEMPTS):  # a death during the recovery: again
                try:
                    state.recover(cause)
                    break
                except PEER_FAILURES as e:
                    cause = e
            else:
                raise cause

    wrapper.__name__ = getattr(func, "__name__", "run")
    wrapper.__doc__ = func.__doc__
    return wrapper
