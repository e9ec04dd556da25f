"""Arguments as the C ABI takes them: reduction ops, C ints and sizes,
timeouts, per-rank count arrays, and the library's errors as exceptions."""

import ctypes
import datetime
import enum
import operator
import sys

from . import _lib, errors


class ReduceOp(enum.IntEnum):
    """gocollRedOp_t. Methods also accept the names as strings, and
    torch.distributed.ReduceOp values.

    BAND, BOR and BXOR (bitwise and, or, xor) take integer and bool buffers
    only. On bool buffers SUM and MAX are logical or, PROD and MIN logical
    and (torch's rules); AVG is refused."""

    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    AVG = 4
    BAND = 5
    BOR = 6
    BXOR = 7


class DataType(enum.IntEnum):
    """gocollDataType_t (informational: buffers carry their dtype). 10 and 11
    are NCCL's float8 numbers, no types in gocoll."""

    INT8 = 0
    UINT8 = 1
    INT32 = 2
    UINT32 = 3
    INT64 = 4
    UINT64 = 5
    FLOAT16 = 6
    FLOAT32 = 7
    FLOAT64 = 8
    BFLOAT16 = 9
    INT16 = 12
    BOOL = 13


_OP_NAMES = {
    "sum": 0, "prod": 1, "product": 1, "max": 2, "min": 3, "avg": 4, "mean": 4, "average": 4,
    "band": 5, "bor": 6, "bxor": 7,
}
_OP_LIST = "'sum', 'prod', 'max', 'min', 'avg', 'band', 'bor', 'bxor'"
# torch.distributed.ReduceOp names -> gocollRedOp_t
_TORCH_OPS = (("SUM", 0), ("PRODUCT", 1), ("MAX", 2), ("MIN", 3), ("AVG", 4), ("BAND", 5),
              ("BOR", 6), ("BXOR", 7))


_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
MONITOR_TAG = _INT_MAX  # the message tag monitored_barrier uses; user tags are below it
_SIZE_MAX = (1 << (8 * ctypes.sizeof(ctypes.c_size_t))) - 1


def _c_int(value, what):
    """``value`` as a C int, or InvalidArgument naming ``what``: a string
    such as "1" or a float is refused rather than converted (a silent int()
    would hide a caller's mix-up), and so is a value ctypes would truncate."""
    try:
        v = operator.index(value)
    except TypeError:
        raise errors.InvalidArgument("gocoll: %s must be an integer, got %r" % (what, value)) from None
    if not _INT_MIN <= v <= _INT_MAX:
        raise errors.InvalidArgument("gocoll: %s %d does not fit a C int" % (what, v))
    return v


def _c_size(value, what):
    """``value`` as a C size_t (a non-negative integer), or InvalidArgument."""
    try:
        v = operator.index(value)
    except TypeError:
        raise errors.InvalidArgument("gocoll: %s must be an integer, got %r" % (what, value)) from None
    if not 0 <= v <= _SIZE_MAX:
        raise errors.InvalidArgument("gocoll: %s %d is not a valid size" % (what, v))
    return v


def _op(op):
    if isinstance(op, str):
        v = _OP_NAMES.get(op.lower())
        if v is None:
            raise errors.InvalidArgument(
                "gocoll: unknown reduction op %r; use one of %s or gocoll.ReduceOp" % (op, _OP_LIST))
        return v
    if isinstance(op, int) and not isinstance(op, bool) and 0 <= op <= 7:
        return int(op)
    td = sys.modules.get("torch.distributed")
    red = getattr(td, "ReduceOp", None)
    if red is not None and isinstance(op, (red, getattr(red, "RedOpType", red))):
        for name, v in _TORCH_OPS:
            if hasattr(red, name) and op == getattr(red, name):
                return v
    raise errors.InvalidArgument("gocoll: unknown reduction op %r; use one of %s or gocoll.ReduceOp"
                                 % (op, _OP_LIST))


def _error(lib, rc, op, comm_handle):
    detail = lib.gocollGetLastError(comm_handle)
    detail = detail.decode("utf-8", "replace") if detail else ""
    reason = lib.gocollGetErrorString(rc)
    reason = reason.decode("utf-8", "replace") if reason else None
    if not detail:
        detail = "gocoll: %s failed: %s" % (op, reason)
    return errors.from_code(rc, detail, reason, op)


def _check_call(rc, op, comm_handle=None):
    if rc != 0:
        raise _error(_lib.load(), rc, op, comm_handle)


def _timeout_ms(timeout):
    """A wait's timeout in milliseconds for gocollWaitTimeout; None: none."""
    if timeout is None:
        return None
    secs = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
    try:
        secs = float(secs)
    except (TypeError, ValueError):
        raise errors.InvalidArgument("gocoll: wait: timeout must be seconds or a timedelta, got %r"
                                     % (timeout,)) from None
    if secs < 0 or secs != secs:
        raise errors.InvalidArgument("gocoll: wait: timeout %r is negative" % (timeout,))
    if secs == 0:
        return None  # torch's C++ passes a zero timeout for "none"
    return min(int(secs * 1000 + 0.999), _INT_MAX)


def _ptr_array(values, n, what, op="alltoallv"):
    if values is None:
        return None
    try:
        vals = [operator.index(v) for v in values]
    except TypeError:
        raise errors.InvalidArgument("gocoll: %s: %s must hold integers, got %r" % (op, what, values)) from None
    if len(vals) != n:
        raise errors.InvalidArgument("gocoll: %s: %s has %d entries, want one per rank (%d)"
                                     % (op, what, len(vals), n))
    if any(v < 0 for v in vals):
        raise errors.InvalidArgument("gocoll: %s: %s has a negative entry: %s" % (op, what, vals))
    if any(v > _SIZE_MAX for v in vals):
        raise errors.InvalidArgument("gocoll: %s: %s has an entry too large for size_t: %s" % (op, what, vals))
    return vals
