"""Finding, loading and declaring libgocoll.so (ctypes only).

Loading the library starts a Go runtime in this process, so it happens on
first use, not at ``import gocoll``: a program may import gocoll, fork
worker processes, and only then create a communicator. Once the library is
loaded this process must not fork and keep using it (the Go runtime does
not survive fork()); :func:`check_process` refuses every call made in a
forked child.
"""

import ctypes
import os
import threading

LIBRARY_ENV = "GOCOLL_LIBRARY"
LIBRARY_NAME = "libgocoll.so"
UNIQUE_ID_BYTES = 128
SPLIT_NOCOLOR = -1

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
# bridge/python/gocoll -> repository root
_REPO_ROOT = os.path.normpath(os.path.join(_PKG_DIR, os.pardir, os.pardir, os.pardir))


class Map(ctypes.Structure):
    """gocollMap_t: a resource map's description."""

    _fields_ = [("ndims", ctypes.c_int), ("extent", ctypes.POINTER(ctypes.c_size_t)),
                ("tile", ctypes.POINTER(ctypes.c_size_t)), ("devices", ctypes.c_int),
                ("assign", ctypes.c_int), ("weights", ctypes.POINTER(ctypes.c_double))]


class BlockType(ctypes.Structure):
    """gocollBlockType_t: count runs of blocklen elements, stride apart."""

    _fields_ = [("datatype", ctypes.c_int), ("count", ctypes.c_size_t), ("blocklen", ctypes.c_size_t),
                ("stride", ctypes.c_size_t)]


class UniqueId(ctypes.Structure):
    """gocollUniqueId: 128 opaque bytes, passed by value."""

    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]


CONFIG_MAGIC = 0x60C011CF  # GOCOLL_CONFIG_MAGIC
CONFIG_VERSION = 4  # GOCOLL_CONFIG_VERSION
CONFIG_UNDEF_INT = -(1 << 31)  # GOCOLL_CONFIG_UNDEF_INT


class Config(ctypes.Structure):
    """gocollConfig_t, layout version 4. ``Config()`` is
    GOCOLL_CONFIG_INITIALIZER: the header filled in, every field unset."""

    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint),
                ("timeoutMs", ctypes.c_int),
                ("algo", ctypes.c_char_p), ("debug", ctypes.c_char_p),
                ("debugFile", ctypes.c_char_p), ("transport", ctypes.c_char_p),
                ("socketIfname", ctypes.c_char_p), ("netBandwidth", ctypes.c_char_p),
                ("dumpDir", ctypes.c_char_p),
                ("cma", ctypes.c_int), ("bruckRadix", ctypes.c_int), ("hdSegments", ctypes.c_int),
                ("flightRecords", ctypes.c_int),
                ("shrinkQuorum", ctypes.c_char_p), ("tune", ctypes.c_char_p),
                ("connect", ctypes.c_char_p)]

    def __init__(self):
        super().__init__(size=ctypes.sizeof(Config), magic=CONFIG_MAGIC, version=CONFIG_VERSION)
        for name, ctype in self._fields_[3:]:
            if ctype is ctypes.c_int:
                setattr(self, name, CONFIG_UNDEF_INT)  # strings start as NULL: unset


c_int = ctypes.c_int
c_size_t = ctypes.c_size_t
c_void_p = ctypes.c_void_p
c_char_p = ctypes.c_char_p
p_size_t = ctypes.POINTER(ctypes.c_size_t)
p_void_p = ctypes.POINTER(ctypes.c_void_p)
p_int = ctypes.POINTER(ctypes.c_int)
Result = ctypes.c_int  # gocollResult_t
DataType = ctypes.c_int  # gocollDataType_t
RedOp = ctypes.c_int  # gocollRedOp_t
Comm = c_void_p  # gocollComm_t (an opaque identifier, not an address)
Request = c_void_p  # gocollRequest_t

# Every function of gocoll.h: name -> (restype, argtypes).
SIGNATURES = {
    "gocollGetVersion": (Result, [p_int]),
    "gocollGetErrorString": (c_char_p, [Result]),
    "gocollGetLastError": (c_char_p, [Comm]),
    "gocollGetUniqueId": (Result, [ctypes.POINTER(UniqueId)]),
    "gocollCommInitRank": (Result, [ctypes.POINTER(Comm), c_int, UniqueId, c_int]),
    "gocollCommInitFromEnv": (Result, [ctypes.POINTER(Comm)]),
    "gocollCommInitRankConfig": (Result, [ctypes.POINTER(Comm), c_int, UniqueId, c_int,
                                          ctypes.POINTER(Config)]),
    "gocollCommInitFromEnvConfig": (Result, [ctypes.POINTER(Comm), ctypes.POINTER(Config)]),
    "gocollCommSplit": (Result, [Comm, c_int, c_int, ctypes.POINTER(Comm)]),
    "gocollCommDestroy": (Result, [Comm]),
    "gocollCommAbort": (Result, [Comm]),
    "gocollCommRevoke": (Result, [Comm, c_int]),
    "gocollCommShrink": (Result, [Comm, p_int, c_int, ctypes.POINTER(Comm), ctypes.POINTER(Config), c_int]),
    "gocollCommGetFailed": (Result, [Comm, p_int, c_int, p_int]),
    "gocollCommJoinInfo": (Result, [Comm, ctypes.c_char_p, c_size_t, p_size_t]),
    "gocollCommJoiners": (Result, [Comm, p_int]),
    "gocollCommGrow": (Result, [Comm, c_int, ctypes.POINTER(Comm)]),
    "gocollCommJoin": (Result, [ctypes.POINTER(Comm), ctypes.c_char_p, ctypes.POINTER(UniqueId),
                                ctypes.POINTER(Config)]),
    "gocollCommCount": (Result, [Comm, p_int]),
    "gocollCommUserRank": (Result, [Comm, p_int]),
    "gocollCommGetAsyncError": (Result, [Comm, p_int]),
    "gocollCommGetTopology": (Result, [Comm, ctypes.c_char_p, c_size_t, p_size_t]),
    "gocollCommDumpState": (Result, [Comm, ctypes.c_char_p, c_size_t]),
    "gocollMemAlloc": (Result, [p_void_p, c_size_t, Comm]),
    "gocollMemFree": (Result, [c_void_p, Comm]),
    # blocking collectives
    "gocollAllReduce": (Result, [c_void_p, c_void_p, c_size_t, DataType, RedOp, Comm]),
    "gocollReduce": (Result, [c_void_p, c_void_p, c_size_t, DataType, RedOp, c_int, Comm]),
    "gocollBroadcast": (Result, [c_void_p, c_void_p, c_size_t, DataType, c_int, Comm]),
    "gocollAllGather": (Result, [c_void_p, c_void_p, c_size_t, DataType, Comm]),
    "gocollReduceScatter": (Result, [c_void_p, c_void_p, c_size_t, DataType, RedOp, Comm]),
    "gocollAllToAll": (Result, [c_void_p, c_void_p, c_size_t, DataType, Comm]),
    "gocollAllToAllv": (Result, [c_void_p, p_size_t, p_size_t, c_void_p, p_size_t, p_size_t, DataType, Comm]),
    "gocollSend": (Result, [c_void_p, c_size_t, DataType, c_int, Comm]),
    "gocollRecv": (Result, [c_void_p, c_size_t, DataType, c_int, Comm]),
    "gocollSendTag": (Result, [c_void_p, c_size_t, DataType, c_int, c_int, Comm]),
    "gocollRecvTag": (Result, [c_void_p, c_size_t, DataType, c_int, c_int, Comm]),
    "gocollRecvAny": (Result, [c_void_p, c_size_t, DataType, c_int, p_int, Comm]),
    "gocollBarrier": (Result, [Comm]),
    # non-blocking forms: same arguments plus gocollRequest_t*
    "gocollIAllReduce": (Result, [c_void_p, c_void_p, c_size_t, DataType, RedOp, Comm, p_void_p]),
    "gocollIReduce": (Result, [c_void_p, c_void_p, c_size_t, DataType, RedOp, c_int, Comm, p_void_p]),
    "gocollIBroadcast": (Result, [c_void_p, c_void_p, c_size_t, DataType, c_int, Comm, p_void_p]),
    "gocollIAllGather": (Result, [c_void_p, c_void_p, c_size_t, DataType, Comm, p_void_p]),
    "gocollIReduceScatter": (Result, [c_void_p, c_void_p, c_size_t, DataType, RedOp, Comm, p_void_p]),
    "gocollIAllToAll": (Result, [c_void_p, c_void_p, c_size_t, DataType, Comm, p_void_p]),
    "gocollIAllToAllv": (Result, [c_void_p, p_size_t, p_size_t, c_void_p, p_size_t, p_size_t, DataType, Comm,
                                  p_void_p]),
    "gocollISend": (Result, [c_void_p, c_size_t, DataType, c_int, Comm, p_void_p]),
    "gocollIRecv": (Result, [c_void_p, c_size_t, DataType, c_int, Comm, p_void_p]),
    "gocollISendTag": (Result, [c_void_p, c_size_t, DataType, c_int, c_int, Comm, p_void_p]),
    "gocollIRecvTag": (Result, [c_void_p, c_size_t, DataType, c_int, c_int, Comm, p_void_p]),
    "gocollIRecvAny": (Result, [c_void_p, c_size_t, DataType, c_int, p_int, Comm, p_void_p]),
    "gocollIBarrier": (Result, [Comm, p_void_p]),
    "gocollAllToAllw": (Result, [c_void_p, p_size_t, ctypes.POINTER(BlockType), c_void_p, p_size_t,
                                 ctypes.POINTER(BlockType), Comm]),
    "gocollIAllToAllw": (Result, [c_void_p, p_size_t, ctypes.POINTER(BlockType), c_void_p, p_size_t,
                                  ctypes.POINTER(BlockType), Comm, p_void_p]),
    "gocollTest": (Result, [Request, p_int]),
    "gocollWait": (Result, [Request]),
    "gocollWaitTimeout": (Result, [Request, c_int, p_int]),
    # redistribution plans
    "gocollPlanCyclic": (Result, [p_void_p, c_int, c_int, c_int, c_int, ctypes.c_long, ctypes.c_long,
                                  ctypes.c_long, ctypes.c_long, c_size_t]),
    "gocollPlanMaps": (Result, [p_void_p, ctypes.POINTER(Map), ctypes.POINTER(Map)]),
    "gocollPlanPlace": (Result, [c_void_p, p_int, p_int]),
    "gocollPlanCounts": (Result, [c_void_p, c_int, p_size_t, p_size_t]),
    "gocollPlanGetJSON": (Result, [c_void_p, c_char_p, c_size_t, p_size_t]),
    "gocollRedistribute": (Result, [c_void_p, c_void_p, c_void_p, DataType, Comm]),
    "gocollPlanDestroy": (Result, [c_void_p]),
    # virtual devices
    "gocollVCommCreate": (Result, [p_void_p, Comm, c_char_p, c_int, p_int]),
    "gocollVCommLocal": (Result, [c_void_p, p_int, c_int, p_int]),
    "gocollVCommDeviceRank": (Result, [c_void_p, c_int, p_int]),
    "gocollVCommGetTables": (Result, [c_void_p, c_char_p, c_size_t, p_size_t]),
    "gocollVCommRegister": (Result, [c_void_p, c_int, c_char_p, c_void_p, c_size_t]),
    "gocollVCommGetBuffer": (Result, [c_void_p, c_int, c_char_p, p_void_p, p_size_t]),
    "gocollVCommMigrate": (Result, [c_void_p, p_int]),
    "gocollVCommRegisterShared": (Result, [c_void_p, c_char_p, c_void_p, c_size_t]),
    "gocollVCommJoin": (Result, [p_void_p, Comm, c_char_p, c_int, c_int, ctypes.POINTER(ctypes.c_uint64)]),
    "gocollVCommJoinPlace": (Result, [p_void_p, Comm, c_char_p, c_int, c_int, p_int, ctypes.POINTER(ctypes.c_uint64)]),
    "gocollVCommRecover": (Result, [c_void_p, Comm, ctypes.c_uint64, c_int, p_int, ctypes.POINTER(ctypes.c_uint64)]),
    "gocollVCommDestroy": (Result, [c_void_p]),
    "gocollVAllReduce": (Result, [c_void_p, c_void_p, c_size_t, DataType, RedOp, c_void_p]),
    "gocollVReduce": (Result, [c_void_p, c_void_p, c_size_t, DataType, RedOp, c_int, c_void_p]),
    "gocollVBroadcast": (Result, [c_void_p, c_void_p, c_size_t, DataType, c_int, c_void_p]),
    "gocollVAllGather": (Result, [c_void_p, c_void_p, c_size_t, DataType, c_void_p]),
    "gocollVReduceScatter": (Result, [c_void_p, c_void_p, c_size_t, DataType, RedOp, c_void_p]),
    "gocollVAllToAll": (Result, [c_void_p, c_void_p, c_size_t, DataType, c_void_p]),
    "gocollVBarrier": (Result, [c_void_p]),
    "gocollVRedistribute": (Result, [c_void_p, c_void_p, c_void_p, DataType, c_void_p]),
    "gocollVIAllReduce": (Result, [c_void_p, c_void_p, c_size_t, DataType, RedOp, c_void_p, p_void_p]),
    "gocollVIReduce": (Result, [c_void_p, c_void_p, c_size_t, DataType, RedOp, c_int, c_void_p, p_void_p]),
    "gocollVIBroadcast": (Result, [c_void_p, c_void_p, c_size_t, DataType, c_int, c_void_p, p_void_p]),
    "gocollVIAllGather": (Result, [c_void_p, c_void_p, c_size_t, DataType, c_void_p, p_void_p]),
    "gocollVIReduceScatter": (Result, [c_void_p, c_void_p, c_size_t, DataType, RedOp, c_void_p, p_void_p]),
    "gocollVIAllToAll": (Result, [c_void_p, c_void_p, c_size_t, DataType, c_void_p, p_void_p]),
}


class LibraryNotFound(ImportError):
    """libgocoll.so could not be loaded from any of the places tried."""

    def __init__(self, tried):
        self.tried = list(tried)
        lines = ["gocoll: could not load %s; tried:" % LIBRARY_NAME]
        for path, why in self.tried:
            lines.append("  %s: %s" % (path, why))
        lines.append(
            "Build it with build/build.sh (output in build/out/lib/), copy it into the "
            "gocoll package directory, or set %s to its path." % LIBRARY_ENV)
        super().__init__("\n".join(lines))


def candidate_paths(environ=None):
    """The places :func:`load` tries, in order, as (path, origin) pairs.

    1. ``$GOCOLL_LIBRARY`` when set (then nothing else: an explicit choice
       that fails is an error, not a reason to pick another library);
    2. a copy inside the package: ``gocoll/libgocoll.so`` or
       ``gocoll/lib/libgocoll.so``;
    3. the repository's build output, ``build/out/lib/libgocoll.so``;
    4. the dynamic linker's search path (``LD_LIBRARY_PATH``, ldconfig).
    """
    environ = os.environ if environ is None else environ
    explicit = environ.get(LIBRARY_ENV)
    if explicit:
        return [(explicit, "$" + LIBRARY_ENV)]
    return [
        (os.path.join(_PKG_DIR, LIBRARY_NAME), "package"),
        (os.path.join(_PKG_DIR, "lib", LIBRARY_NAME), "package"),
        (os.path.join(_REPO_ROOT, "build", "out", "lib", LIBRARY_NAME), "repository build output"),
        (LIBRARY_NAME, "dynamic linker search path"),
    ]


def _declare(cdll):
    missing = []
    for name, (restype, argtypes) in SIGNATURES.items():
        try:
            fn = getattr(cdll, name)
        except AttributeError:
            missing.append(name)
            continue
        fn.restype = restype
        fn.argtypes = argtypes
    return missing


class Library:
    """The loaded library: ``lib.gocollAllReduce(...)`` etc., all declared."""

    def __init__(self, path, cdll, missing):
        self.path = path
        self.cdll = cdll
        self.missing = missing
        for name in SIGNATURES:
            if name not in missing:
                setattr(self, name, getattr(cdll, name))
        v = ctypes.c_int()
        rc = self.gocollGetVersion(ctypes.byref(v))
        self.version = v.value if rc == 0 else None

    def __getattr__(self, name):
        if name.startswith("gocoll") and name in SIGNATURES:
            raise NotImplementedError("gocoll: %s is not exported by %s" % (name, self.path))
        raise AttributeError(name)


_lock = threading.Lock()
_lib = None
_loaded_pid = None
_forked = False


def _after_fork_in_child():
    global _forked
    if _lib is not None:
        _forked = True


os.register_at_fork(after_in_child=_after_fork_in_child)


def forked():
    """True in a child forked after this process loaded the library."""
    return _forked


def check_process():
    if _forked:
        raise RuntimeError(
            "gocoll: this process was forked after process %d loaded libgocoll; the Go runtime "
            "inside it does not survive fork(), so gocoll cannot be used here. Start workers "
            "with multiprocessing's 'spawn' start method (multiprocessing.get_context('spawn')) "
            "or as separate programs (subprocess, torchrun)." % _loaded_pid)


def load(environ=None):
    """Load and declare libgocoll (once per process) and return it."""
    global _lib, _loaded_pid
    check_process()
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for path, origin in candidate_paths(environ):
            if os.sep in path and not os.path.exists(path):
                tried.append((path, "no such file (%s)" % origin))
                continue
            try:
                cdll = ctypes.CDLL(path)
            except OSError as e:
                tried.append((path, "%s (%s)" % (e, origin)))
                continue
            missing = _declare(cdll)
            _loaded_pid = os.getpid()
            _lib = Library(path, cdll, missing)
            return _lib
        raise LibraryNotFound(tried)


def loaded():
    """The loaded library, or None if nothing loaded it yet."""
    return _lib
