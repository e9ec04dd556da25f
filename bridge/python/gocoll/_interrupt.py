"""Ctrl-C during a blocking call.

ctypes releases the GIL for the length of a call, but Python runs signal
handlers only between bytecodes of the main thread: a KeyboardInterrupt
would wait until the call returns, which is GOCOLL_TIMEOUT later when a peer
never arrives. So the first blocking call made on the main thread points
Python's signal wake-up fd (signal.set_wakeup_fd) at a pipe that a daemon
thread reads. When SIGINT arrives while the main thread is inside a blocking
call and SIGINT still raises KeyboardInterrupt (Python's default handler),
that thread aborts the call's communicator (gocollCommAbort, which any
thread may call): the call returns, and Python raises KeyboardInterrupt. The
communicator is unusable afterwards, as after any failure, and its peers
learn of the abort.

The main thread may also wait where gocoll cannot see it: inside torch,
when DDP's reducer waits in C++ for the future of gocoll's comm hook (or of
the "gocoll" backend's work) and no Python runs until the peer answers. Such
operations :func:`arm` their communicator while they are in flight, and
SIGINT aborts armed communicators too; the future then fails, DDP returns to
Python, and Python raises KeyboardInterrupt.

Nothing is installed when the wake-up fd is already taken (asyncio's event
loop uses it) or the module is first used off the main thread; Ctrl-C then
waits for the call to end, as before. Other signals, and SIGINT with a
handler of the program's own, leave communicators alone.
"""

import os
import signal
import threading

_main_ident = threading.main_thread().ident
_lock = threading.Lock()
_installed = None  # None: not tried yet; then True or False
_current = None  # the communicator of the blocking call on the main thread
_armed = {}  # id(comm) -> [comm, operations in flight]: see arm()


def _watching():
    """Whether Ctrl-C can reach a call here: only on the main thread, once
    the SIGINT handler is installed (installed on first use)."""
    if threading.get_ident() != _main_ident:
        return False
    if _installed is None:
        _install()
    return bool(_installed)


def enter(comm):
    """Note a blocking call on ``comm`` starting; returns whether it was
    noted (then call :func:`leave` when it returns)."""
    global _current
    if not _watching():
        return False
    _current = comm
    return True


def leave():
    global _current
    _current = None


def arm(comm):
    """Note an operation on ``comm`` that the main thread will wait for
    inside torch (a future handed to DDP): until :func:`disarm`, Ctrl-C
    aborts ``comm``. Returns whether it was noted (only on the main thread,
    where SIGINT raises KeyboardInterrupt)."""
    if not _watching():
        return False
    with _lock:
        entry = _armed.setdefault(id(comm), [comm, 0])
        entry[1] += 1
    return True


def disarm(comm):
    """The end of an operation :func:`arm` noted (any thread may call it)."""
    with _lock:
        entry = _armed.get(id(comm))
        if entry is not None:
            entry[1] -= 1
            if entry[1] <= 0:
                del _armed[id(comm)]


def installed():
    """Whether Ctrl-C can interrupt blocking calls in this process."""
    return bool(_installed)


def _install():
    global _installed
    with _lock:
        if _installed is not None:
            return
        _installed = False
        r, w = os.pipe()
        try:
            os.set_blocking(w, False)
            old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (ValueError, OSError):  # not the main thread, or no signals
            os.close(r)
            os.close(w)
            return
        if old != -1:  # someone else's (an event loop): give it back
            signal.set_wakeup_fd(old)
            os.close(r)
            os.close(w)
            return
        threading.Thread(target=_watch, args=(r,), name="gocoll-interrupt", daemon=True).start()
        _installed = True


def _watch(fd):
    while True:
        try:
            data = os.read(fd, 512)
        except InterruptedError:
            continue
        except OSError:
            return
        if not data:
            return
        if signal.SIGINT not in data:
            continue
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            continue
        with _lock:
            comms = [e[0] for e in _armed.values()]
        if _current is not None:
            comms.append(_current)
        for comm in comms:
            if comm._closed:
                continue
            comm._interrupted = True  # its abort() and destroy() then only tidy up
            comm._lib.gocollCommAbort(comm._h)
