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
update. A recovery changes this rank's arrays only when it succeeds, so
``step`` is always the step of the arrays.

The job file (``job_file``) has the format of Go's vppu/elastic: the join
info of the job's current view, its members' pids and the view's epoch::

    gocoll-join:1:<tag>:<address>
    pids 4100 4101 4103
    epoch 2

It is rewritten only as a compare-and-swap (under ``fcntl.flock`` of
``job_file + ".lock"``): the file must still hold the view this rank came
from. A rank that was left out (paused past the timeout, resumed after the
others went on) finds the others' view there and stops with
:class:`Superseded`, it and every rank of its view.
"""

import fcntl
import os
import time

import numpy as np

from .errors import PEER_FAILURES, Excluded
from .vppu import VirtualComm

MAX_ATTEMPTS = 8  # shrink+recover rounds of one recovery (one per lost process at most)


class Superseded(Excluded):
    """The job file no longer holds the view this rank came from: other
    ranks went on without it. Not a peer failure: stop (or join anew)."""


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
        self._view = ""  # the job file's view this rank belongs to ("" before the first)

    @classmethod
    def join(cls, job_file, ndev, topology="ring", min_ranks=0, replaces=None, timeout=300, **arrays):
        """A replacement process joins the job of ``job_file`` (written by
        its rank 0) once the file no longer lists the pid ``replaces`` (the
        process it replaces), is admitted at a step boundary and receives
        devices and the state, copied into ``arrays``. Needs the job's
        GOCOLL_SECRET. A process whose ``ndev``, ``topology`` or
        ``min_ranks`` differ from the members' is refused
        (:class:`~gocoll.errors.InvalidArgument`); the job goes on."""
        from .comm import join as join_comm
        self = cls.__new__(cls)
        self._setup(ndev, topology, min_ranks, job_file, arrays)
        deadline, last = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            try:
                info, pids, _ = _read_job(job_file)
                if replaces is not None and int(replaces) in pids:
                    raise OSError("the job has not yet recovered from the death of pid %s" % replaces)
                self.comm = join_comm(info)
                self._view = info
                break
            except (OSError, ValueError) + PEER_FAILURES as e:
                last = e
                time.sleep(0.02)
        else:
            raise RuntimeError("gocoll.elastic: could not join through %s: %r" % (job_file, last))
        try:
            self.vcomm, self.step = VirtualComm.join(self.comm, topology, ndev, min_ranks=min_ranks)
        except Exception:
            self.comm.destroy()  # refused, or the job failed: this process leaves
            raise
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
        """Collective (when admitting replacements): rank 0 swaps the job
        file from the view this rank came from to the current one (with the
        members' pids) and tells the others whether it could; if not, every
        rank of the view raises :class:`Superseded`."""
        if not self.job_file:
            return
        mine = np.array([os.getpid()], np.int64)
        pids = [np.zeros(1, np.int64) for _ in range(self.comm.size)]
        self.comm.all_gather(pids, mine)
        info = self.comm.join_info()
        verdict = np.zeros(1, np.int64)  # rank 0: 1 when the file holds another view
        why = ""
        if self.comm.rank == 0:
            try:
                _swap_job(self.job_file, self._view, info, [int(p[0]) for p in pids])
            except Superseded as e:
                verdict[0], why = 1, str(e)
        self.comm.broadcast(verdict, src=0)
        if verdict[0]:
            raise Superseded("gocoll.elastic: rank %d: another view of the job was published: this rank was left "
                             "out%s" % (self.comm.rank, " (%s)" % why if why else ""), code=10)
        self._view = info

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
            try:
                self.step = self.vcomm.recover(self.comm, self.step, min_ranks=self.min_ranks)
            finally:
                old.destroy()  # also when the recovery failed: the grown one is the job's now
            # A joiner the members refused (another ndev) has left: this
            # collective fails as after a death, and run() shrinks it out.
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


def _read_job(path):
    """The job file's (info, pids, epoch)."""
    with open(path) as f:
        lines = f.read().strip().split("\n")
    if len(lines) < 2 or not lines[0].startswith("gocoll-join:") or not lines[1].startswith("pids"):
        raise ValueError("job file %s: not what the job writes" % path)
    epoch = 0
    if len(lines) > 2:
        if not lines[2].startswith("epoch "):
            raise ValueError("job file %s: epoch line %r" % (path, lines[2]))
        epoch = int(lines[2][len("epoch "):])
    return lines[0], [int(p) for p in lines[1].split()[1:]], epoch


def _swap_job(path, parent, info, pids):
    """Write the view ``info`` (members ``pids``) to the job file if it
    holds the view ``parent`` (or ``parent`` is "": the job's first view),
    under an exclusive flock of path + ".lock" across the read and the
    atomic rename; raise Superseded otherwise. Returns the epoch written."""
    with open(path + ".lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            try:
                cur = _read_job(path)
            except (OSError, ValueError) as e:
                cur, err = None, e
            if parent and cur is None:
                raise Superseded("the job file is unreadable (%s), so this rank cannot tell that the view it came from "
                                 "is still the job's" % err, code=10)
            if parent and cur[0] != parent:
                raise Superseded("%s holds the view of epoch %d (pids %s), not the one this rank came from"
                                 % (path, cur[2], cur[1]), code=10)
            epoch = 0 if cur is None else cur[2] + 1
            tmp = "%s.%d.tmp" % (path, os.getpid())
            with open(tmp, "w") as f:
                f.write("%s\npids %s\nepoch %d\n" % (info, " ".join(str(p) for p in pids), epoch))
            os.replace(tmp, path)
            return epoch
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


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
