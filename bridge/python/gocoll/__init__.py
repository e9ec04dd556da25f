"""gocoll — collective communication for ML training on CPUs, from Python.

A thin ctypes bridge over ``libgocoll.so`` (no compiled extension)::

    import gocoll
    comm = gocoll.init()                    # torchrun / mpirun / srun environment
    comm.all_reduce(tensor)                 # in place, numpy or torch CPU, no copy
    work = comm.all_reduce(t2, op="avg", async_op=True)
    ...
    work.wait()

or with an explicit rendezvous::

    uid = gocoll.get_unique_id()            # on one process; send the bytes to the others
    comm = gocoll.init(rank=r, size=n, unique_id=uid)

PyTorch gradient hooks are in :mod:`gocoll.torch` (importing :mod:`gocoll`
does not import torch).

The library is loaded on first use (``GOCOLL_LIBRARY``, a copy inside this
package, the repository's ``build/out/lib/``, then the dynamic linker's
path). Loading starts a Go runtime, which does not survive ``fork()``: once a
process used gocoll it must not fork and use it in the child. Use
``multiprocessing.get_context("spawn")`` (or subprocesses / a launcher) for
worker processes; a forked child that calls gocoll gets a RuntimeError
instead of a hang or crash.

GOCOLL_* settings (GOCOLL_TIMEOUT, GOCOLL_ALGO, …) are read from the process
environment when a communicator or unique id is made; ``gocoll.init(...,
timeout=, algo=, debug=)`` gives one communicator its own.
"""

from . import errors, vppu
from ._lib import LibraryNotFound, candidate_paths as library_candidates
from ._lib import load as load_library
from .comm import (Comm, DataType, MemBlock, ReduceOp, Work, get_unique_id, init, join, version)
from .errors import (PEER_FAILURES, Error, Excluded, InProgress, InternalError, InvalidArgument, InvalidUsage,
                     NoQuorum, RemoteError, Revoked, SystemCallError, Timeout, UnhandledError, UnsupportedDtype)

SUM = ReduceOp.SUM
PROD = ReduceOp.PROD
MAX = ReduceOp.MAX
MIN = ReduceOp.MIN
AVG = ReduceOp.AVG
BAND = ReduceOp.BAND
BOR = ReduceOp.BOR
BXOR = ReduceOp.BXOR

UNIQUE_ID_BYTES = 128

__version__ = "0.1.0"


def library_path():
    """Path of the loaded libgocoll (loads it if needed)."""
    return load_library().path


__all__ = [
    "init", "join", "get_unique_id", "version", "library_path", "load_library", "library_candidates",
    "Comm", "Work", "MemBlock", "ReduceOp", "DataType", "SUM", "PROD", "MAX", "MIN", "AVG",
    "BAND", "BOR", "BXOR",
    "UNIQUE_ID_BYTES", "Error", "UnhandledError", "SystemCallError", "InternalError",
    "InvalidArgument", "UnsupportedDtype", "InvalidUsage", "RemoteError", "InProgress", "Timeout",
    "Revoked", "Excluded", "NoQuorum", "PEER_FAILURES",
    "LibraryNotFound", "errors",
]
