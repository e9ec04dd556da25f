"""Exceptions: one class per gocollResult_t, all derived from :class:`Error`.

Each also derives from the built-in exception a Python programmer would
catch for that kind of failure, so ``except ValueError`` or
``except TimeoutError`` work as expected::

    Error                                  every failure reported by gocoll
    ├── UnhandledError                     gocollUnhandledError (1)
    ├── SystemCallError   (OSError)        gocollSystemError (2): socket, shm, mmap
    ├── InternalError                      gocollInternalError (3): a bug in gocoll
    ├── InvalidArgument   (ValueError)     gocollInvalidArgument (4)
    │   └── UnsupportedDtype (TypeError)   a dtype gocoll has no type for (Python side)
    ├── InvalidUsage      (RuntimeError)   gocollInvalidUsage (5): destroyed comm, mismatch
    ├── RemoteError       (ConnectionError) gocollRemoteError (6): a peer died or aborted
    ├── InProgress                         gocollInProgress (7)
    ├── Timeout           (TimeoutError)   gocollTimeout (8): GOCOLL_TIMEOUT passed
    ├── Revoked           (ConnectionError) gocollRevoked (9): the communicator was revoked
    ├── Excluded          (RuntimeError)   gocollExcluded (10): the others went on without this rank
    └── NoQuorum          (RuntimeError)   gocollNoQuorum (11): majority quorum, half or fewer agreed

After a peer died, catch :data:`PEER_FAILURES` and shrink the communicator
(docs/elastic.md).

``str(e)`` is the library's detail text (gocollGetLastError); ``e.code`` the
numeric result, ``e.reason`` the short gocollGetErrorString text.
"""

SUCCESS = 0
UNHANDLED_ERROR = 1
SYSTEM_ERROR = 2
INTERNAL_ERROR = 3
INVALID_ARGUMENT = 4
INVALID_USAGE = 5
REMOTE_ERROR = 6
IN_PROGRESS = 7
TIMEOUT = 8
REVOKED = 9
EXCLUDED = 10
NO_QUORUM = 11


class Error(Exception):
    """A failure reported by gocoll (or refused by the Python bridge before
    calling it). ``code`` is the gocollResult_t value, ``reason`` its short
    description, ``detail`` the library's explanation, ``op`` the call."""

    code = None

    def __init__(self, detail, code=None, reason=None, op=None):
        super().__init__(detail)
        if code is not None:
            self.code = code
        self.detail = detail
        self.reason = reason
        self.op = op

    def __str__(self):
        return self.detail

    def __reduce__(self):
        return (type(self), (self.detail, self.code, self.reason, self.op))


class UnhandledError(Error):
    code = UNHANDLED_ERROR


class SystemCallError(Error, OSError):
    code = SYSTEM_ERROR


class InternalError(Error):
    code = INTERNAL_ERROR


class InvalidArgument(Error, ValueError):
    code = INVALID_ARGUMENT


class UnsupportedDtype(InvalidArgument, TypeError):
    """The buffer's element type has no gocoll datatype (bool, int16, complex…)."""


class InvalidUsage(Error, RuntimeError):
    code = INVALID_USAGE


class RemoteError(Error, ConnectionError):
    code = REMOTE_ERROR


class InProgress(Error):
    code = IN_PROGRESS


class Timeout(Error, TimeoutError):
    code = TIMEOUT


class Revoked(Error, ConnectionError):
    """The communicator was revoked (:meth:`Comm.revoke`, here or on a peer,
    or by :meth:`Comm.shrink`): shrink it to go on."""
    code = REVOKED


class Excluded(Error, RuntimeError):
    """The other ranks shrank the communicator without this one (they took
    it for failed: stopped, or too slow past the timeout). It cannot rejoin
    that communicator; exit, or join anew (:func:`gocoll.join`)."""
    code = EXCLUDED


class NoQuorum(Error, RuntimeError):
    """A shrink under the majority quorum (GOCOLL_SHRINK_QUORUM=majority)
    found no more than half of the communicator's ranks: this side of a
    partition must not go on. Not a peer failure: shrinking again will not
    help; stop (the other side, if it holds a majority, goes on)."""
    code = NO_QUORUM


#: What a collective raises when a peer died or the communicator was
#: revoked: the errors after which :meth:`Comm.shrink` lets the survivors
#: go on.
PEER_FAILURES = (RemoteError, Timeout, Revoked)


BY_CODE = {
    UNHANDLED_ERROR: UnhandledError,
    SYSTEM_ERROR: SystemCallError,
    INTERNAL_ERROR: InternalError,
    INVALID_ARGUMENT: InvalidArgument,
    INVALID_USAGE: InvalidUsage,
    REMOTE_ERROR: RemoteError,
    IN_PROGRESS: InProgress,
    TIMEOUT: Timeout,
    REVOKED: Revoked,
    EXCLUDED: Excluded,
    NO_QUORUM: NoQuorum,
}


def from_code(code, detail, reason=None, op=None):
    """The exception for result ``code``; unknown codes give plain Error."""
    cls = BY_CODE.get(code, Error)
    text = detail or reason or "gocoll error %d" % code
    if op and not text.startswith("gocoll"):
        text = "%s: %s" % (op, text)
    e = cls(text, code=code, reason=reason, op=op)
    return e
