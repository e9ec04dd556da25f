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


def enter(comm):
    """Note a blocking call on ``comm`` starting; returns whether it was
    noted (then call :func:`leave` when it returns)."""
    global _current
    if threading.get_ident() != _main_ident:
        return False
    if _installed is None:
        _install()
    if not _installed:
        return False
    _current = comm
    return True


def leave():
    global _current
    _current = None


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
        comm = _current
        if comm is None or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            continue
        comm._interrupted = True  # its abort() and destroy() then only tidy up
        comm._lib.gocollCommAbort(comm._h)
