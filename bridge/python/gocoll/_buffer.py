"""Turning numpy arrays and torch CPU tensors into (pointer, count, datatype)
without copying, and refusing what cannot be passed that way."""

import ctypes
import sys

from . import errors

# gocollDataType_t (10 and 11 are NCCL's float8 numbers, no types here)
INT8, UINT8, INT32, UINT32, INT64, UINT64, FLOAT16, FLOAT32, FLOAT64, BFLOAT16 = range(10)
INT16, BOOL = 12, 13

TYPE_NAMES = {
    INT8: "int8", UINT8: "uint8", INT32: "int32", UINT32: "uint32", INT64: "int64",
    UINT64: "uint64", FLOAT16: "float16", FLOAT32: "float32", FLOAT64: "float64",
    BFLOAT16: "bfloat16", INT16: "int16", BOOL: "bool",
}
TYPE_SIZES = {
    INT8: 1, UINT8: 1, INT32: 4, UINT32: 4, INT64: 8, UINT64: 8,
    FLOAT16: 2, FLOAT32: 4, FLOAT64: 8, BFLOAT16: 2, INT16: 2, BOOL: 1,
}

# numpy: by (kind, itemsize), so that every spelling of a type maps (int64 is
# both 'l' and 'q' on Linux).
_NUMPY_TYPES = {
    ("i", 1): INT8, ("u", 1): UINT8, ("i", 2): INT16, ("i", 4): INT32, ("u", 4): UINT32,
    ("i", 8): INT64, ("u", 8): UINT64, ("f", 2): FLOAT16, ("f", 4): FLOAT32,
    ("f", 8): FLOAT64, ("b", 1): BOOL,
}
_NUMPY_SUPPORTED = "int8, uint8, int16, int32, uint32, int64, uint64, float16, float32, float64, " \
                   "bool (bfloat16 through torch.bfloat16 or ml_dtypes.bfloat16)"

_torch_types = None  # torch.dtype -> gocoll type, built on first tensor


def _torch_map(torch):
    global _torch_types
    if _torch_types is None:
        m = {
            torch.int8: INT8, torch.uint8: UINT8, torch.int16: INT16, torch.int32: INT32,
            torch.int64: INT64, torch.float16: FLOAT16, torch.bfloat16: BFLOAT16,
            torch.float32: FLOAT32, torch.float64: FLOAT64, torch.bool: BOOL,
        }
        for name, t in (("uint32", UINT32), ("uint64", UINT64)):  # torch >= 2.3
            if hasattr(torch, name):
                m[getattr(torch, name)] = t
        _torch_types = m
    return _torch_types


class Buffer:
    """A validated buffer: ``obj`` (kept alive by requests), data pointer,
    element count and gocoll datatype."""

    __slots__ = ("obj", "ptr", "count", "dtype", "is_torch")

    def __init__(self, obj, ptr, count, dtype, is_torch):
        self.obj = obj
        self.ptr = ptr
        self.count = count
        self.dtype = dtype
        self.is_torch = is_torch

    @property
    def itemsize(self):
        return TYPE_SIZES[self.dtype]

    @property
    def nbytes(self):
        return self.count * TYPE_SIZES[self.dtype]

    def describe(self):
        return "%s[%d]" % (TYPE_NAMES[self.dtype], self.count)


def _invalid(what, msg):
    return errors.InvalidArgument("gocoll: %s: %s" % (what, msg), code=errors.INVALID_ARGUMENT)


def _is_tensor(obj):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor), torch


def as_buffer(obj, what="buffer", writable=True):
    """Validate ``obj`` (numpy.ndarray or torch CPU tensor) and return a
    :class:`Buffer` describing its memory. ``what`` names the argument in
    error messages; ``writable`` says whether gocoll will write into it."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        return _numpy_buffer(obj, what, writable)
    is_tensor, torch = _is_tensor(obj)
    if is_tensor:
        return _torch_buffer(torch, obj, what)
    raise TypeError(
        "gocoll: %s must be a numpy.ndarray or a torch CPU tensor, not %s (wrap other "
        "buffers without copying with numpy.frombuffer / torch.frombuffer)"
        % (what, type(obj).__name__))


def _numpy_buffer(a, what, writable):
    dt = a.dtype
    flags = a.flags
    code = _NUMPY_TYPES.get((dt.kind, dt.itemsize))
    if code is None:
        if dt.name == "bfloat16":  # ml_dtypes / jax
            code = BFLOAT16
        else:
            raise errors.UnsupportedDtype(
                "gocoll: %s has dtype %s, which gocoll does not support; supported: %s"
                % (what, dt, _NUMPY_SUPPORTED), code=errors.INVALID_ARGUMENT)
    if not dt.isnative:
        raise _invalid(what, "dtype %s is not in native byte order; convert it with "
                             "a.astype(a.dtype.newbyteorder('='))" % dt)
    if not flags.c_contiguous:
        raise _invalid(what, "array is not C-contiguous (strides %s for shape %s); gocoll "
                             "passes memory without copying, so pass numpy.ascontiguousarray(a) "
                             "(and copy results back yourself)" % (a.strides, a.shape))
    if writable and not flags.writeable:
        raise _invalid(what, "array is read-only and gocoll would write the result into it; "
                             "pass a writable array (a.copy()) or an out= array")
    if not flags.aligned:
        raise _invalid(what, "array data is not aligned to its %d-byte elements" % dt.itemsize)
    return Buffer(a, a.ctypes.data, a.size, code, False)


def _torch_buffer(torch, t, what):
    code = _torch_map(torch).get(t.dtype)
    if code is None:
        raise errors.UnsupportedDtype(
            "gocoll: %s has dtype %s, which gocoll does not support; supported: %s"
            % (what, t.dtype, ", ".join(str(d) for d in _torch_map(torch))),
            code=errors.INVALID_ARGUMENT)
    if not t.is_cpu:
        raise _invalid(what, "tensor is on %s; gocoll reduces host memory only (use .cpu())"
                       % t.device)
    if t.layout is not torch.strided:
        raise _invalid(what, "tensor layout %s is not supported (dense tensors only)" % t.layout)
    if not t.is_contiguous():
        raise _invalid(what, "tensor is not contiguous (strides %s for shape %s); gocoll "
                             "passes memory without copying, so pass t.contiguous() (and copy "
                             "results back yourself)" % (t.stride(), tuple(t.shape)))
    if t.is_neg():
        raise _invalid(what, "tensor is a lazy negation view; call .resolve_neg() first")
    return Buffer(t, t.data_ptr(), t.numel(), code, True)


def new_like(buf, shape):
    """A new uninitialised array/tensor of buf's library and dtype."""
    obj = buf.obj
    if buf.is_torch:
        torch = sys.modules["torch"]
        return torch.empty(shape, dtype=obj.dtype)
    np = sys.modules["numpy"]
    return np.empty(shape, dtype=obj.dtype)


def same_kind(buf, other, what):
    if buf.dtype != other.dtype:
        raise _invalid(what, "dtype %s differs from the input's %s"
                       % (TYPE_NAMES[other.dtype], TYPE_NAMES[buf.dtype]))


def concat(objs):
    """One new 1-D array/tensor holding ``objs`` (of one library) flattened, in order."""
    first = objs[0]
    is_tensor, torch = _is_tensor(first)
    if is_tensor:
        return torch.cat([o.reshape(-1) for o in objs])
    np = sys.modules["numpy"]
    return np.concatenate([np.asarray(o).reshape(-1) for o in objs])


def copy_into(dst, src):
    """Copy the elements of ``src`` (any shape, as many elements) into ``dst``."""
    is_tensor, _ = _is_tensor(dst)
    if is_tensor:
        dst.copy_(src.reshape(dst.shape))
    else:
        dst[...] = src.reshape(dst.shape)


def dtype_count(obj, what):
    """(gocoll datatype, element count) of a numpy array or torch tensor of
    any layout: for buffers gocoll only copies from or into."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        code = _NUMPY_TYPES.get((obj.dtype.kind, obj.dtype.itemsize))
        if code is None and obj.dtype.name == "bfloat16":
            code = BFLOAT16
        if code is None:
            raise errors.UnsupportedDtype("gocoll: %s has dtype %s, which gocoll does not support"
                                          % (what, obj.dtype), code=errors.INVALID_ARGUMENT)
        return code, obj.size
    is_tensor, torch = _is_tensor(obj)
    if not is_tensor:
        raise TypeError("gocoll: %s must be a numpy.ndarray or a torch CPU tensor, not %s"
                        % (what, type(obj).__name__))
    code = _torch_map(torch).get(obj.dtype)
    if code is None:
        raise errors.UnsupportedDtype("gocoll: %s has dtype %s, which gocoll does not support"
                                      % (what, obj.dtype), code=errors.INVALID_ARGUMENT)
    if not obj.is_cpu or obj.layout is not torch.strided:
        raise _invalid(what, "tensor must be a dense CPU tensor (it is %s on %s)"
                       % (obj.layout, obj.device))
    return code, obj.numel()


def byte_source(obj, what):
    """A :class:`Buffer` over ``obj``'s elements in order, for gocoll to copy
    from: ``obj`` itself when contiguous, else a contiguous copy (its
    ``obj`` keeps that copy alive)."""
    dtype_count(obj, what)  # any layout: a readable message for the rest
    is_tensor, _ = _is_tensor(obj)
    if is_tensor:
        if not obj.is_contiguous() or obj.is_neg() or obj.is_conj():
            obj = obj.resolve_conj().resolve_neg().contiguous()
    else:
        np = sys.modules["numpy"]
        if not obj.flags.c_contiguous or not obj.dtype.isnative:
            obj = np.ascontiguousarray(obj, dtype=obj.dtype.newbyteorder("="))
    return as_buffer(obj, what, writable=False)


def write_bytes(dst, src_ptr, nbytes):
    """Fill ``dst`` (a numpy array or torch tensor of any layout) with the
    ``nbytes`` bytes at ``src_ptr``, its elements in order."""
    if nbytes == 0:
        return
    is_tensor, torch = _is_tensor(dst)
    if is_tensor:
        if dst.is_contiguous() and not dst.is_neg() and not dst.is_conj():
            ctypes.memmove(dst.data_ptr(), src_ptr, nbytes)
        else:
            tmp = torch.empty(dst.shape, dtype=dst.dtype)
            ctypes.memmove(tmp.data_ptr(), src_ptr, nbytes)
            dst.copy_(tmp)
        return
    np = sys.modules["numpy"]
    if dst.flags.c_contiguous and dst.flags.writeable and dst.dtype.isnative:
        ctypes.memmove(dst.ctypes.data, src_ptr, nbytes)
    else:
        dst[...] = np.frombuffer((ctypes.c_char * nbytes).from_address(src_ptr),
                                 dtype=dst.dtype.newbyteorder("=")).reshape(dst.shape)


def is_tensor(obj):
    """Whether ``obj`` is a torch tensor (without importing torch)."""
    return _is_tensor(obj)[0]
