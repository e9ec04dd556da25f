"""Non-blocking operations (:class:`Work`) and the thread that runs their
completion callbacks in issue order."""

import ctypes
import sys
import threading

from . import _interrupt, _lib, errors
from ._args import _error, _timeout_ms


class Work:
    """A non-blocking operation, with torch.distributed's ``Work`` methods.
    Keeps the Python objects of its buffers alive until it completed (also
    when the caller drops this handle: the communicator holds it until it is
    done)."""

    __slots__ = ("_comm", "_req", "_keep", "_result", "_op", "_lock", "_done", "_exc", "_post",
                 "_fut", "_source", "__weakref__")

    def __init__(self, comm, req, keep, result, op, post=None, source=None):
        self._comm = comm
        self._req = req
        self._keep = keep
        self._result = result
        self._op = op
        self._post = post  # run once on success (copying out of a staging buffer)
        self._lock = threading.Lock()
        self._done = False
        self._exc = None
        self._fut = None
        self._source = source  # a receive from any source: the C int gocoll writes the sender in

    def _finish(self, rc):
        # with self._lock held
        if rc != 0 and self._comm._interrupted:
            # Said plainly: C++ waiters (DDP) see only this text, while
            # Python raises KeyboardInterrupt at its next bytecode.
            self._exc = errors.InvalidUsage(
                "gocoll: %s on rank %d interrupted: Ctrl-C (SIGINT) aborted the communicator"
                % (self._op, self._comm._rank), code=errors.INVALID_USAGE, op=self._op)
        elif rc != 0:
            self._exc = _error(self._comm._lib, rc, self._op, self._comm._h)
        elif self._post is not None:
            try:
                self._post()
            except Exception as e:  # a staging copy that failed is the operation's error
                self._exc = e
        self._done = True
        self._req = None
        self._keep = None
        self._post = None
        self._comm._forget(self)

    def wait(self, timeout=None):
        """Block until the operation finished and return its result buffer
        (None for barrier and send); raise the operation's error if it
        failed. Never longer than GOCOLL_TIMEOUT after the operation started.

        ``timeout`` (seconds or a ``datetime.timedelta``; None or 0: no
        limit of its own) raises :class:`gocoll.Timeout` when it passes
        first; the operation goes on and can be waited for again."""
        if not self._done:
            _lib.check_process()
            ms = _timeout_ms(timeout)
            # Another thread (the communicator's waiter) may be inside a
            # wait on this work: a timed wait must not block on it longer.
            if not self._lock.acquire(timeout=-1 if ms is None else ms / 1000):
                if not self._done:
                    raise self._timed_out(timeout)
            else:
                try:
                    if not self._done:
                        self._wait_locked(ms)
                finally:
                    self._lock.release()
            if not self._done:
                raise self._timed_out(timeout)
        if self._exc is not None:
            raise self._exc
        return self._result

    def _wait_locked(self, ms):
        lib = self._comm._lib
        noted = _interrupt.enter(self._comm)  # Ctrl-C aborts the communicator
        try:
            if ms is None:
                rc, done = lib.gocollWait(self._req), 1
            else:
                d = ctypes.c_int()
                rc = lib.gocollWaitTimeout(self._req, ms, ctypes.byref(d))
                done = d.value
        finally:
            if noted:
                _interrupt.leave()
        if done:
            self._finish(rc)
        elif rc != 0:
            raise _error(lib, rc, "gocollWaitTimeout", self._comm._h)

    def _timed_out(self, timeout):
        return errors.Timeout("gocoll: %s on rank %d did not finish within %s (Work.wait timeout); "
                              "the operation is still pending" % (self._op, self._comm._rank, timeout),
                              code=errors.TIMEOUT, op=self._op)

    def is_completed(self):
        """True once the operation finished (successfully or not); never blocks.
        Errors are raised by :meth:`wait`."""
        if self._done:
            return True
        _lib.check_process()
        if not self._lock.acquire(blocking=False):
            return False  # another thread is waiting on it
        try:
            if not self._done:
                done = ctypes.c_int()
                rc = self._comm._lib.gocollTest(self._req, ctypes.byref(done))
                if done.value:
                    self._finish(rc)
                elif rc != 0:
                    raise _error(self._comm._lib, rc, "gocollTest", self._comm._h)
        finally:
            self._lock.release()
        return self._done

    def source_rank(self):
        """The rank a receive from any source (``recv(t, src=None)``) took
        its message from; waits for the receive first (and raises its
        error). RuntimeError for other operations, as torch's Work."""
        if self._source is None:
            raise errors.InvalidUsage("gocoll: %s: source_rank() is only defined for a recv from "
                                      "any source (src=None)" % self._op,
                                      code=errors.INVALID_USAGE, op=self._op)
        self.wait()
        return self._source.value

    def is_success(self):
        """Whether the finished operation succeeded; RuntimeError before it finished."""
        if not self.is_completed():
            raise RuntimeError("gocoll: %s: is_success() called before the operation finished"
                               % self._op)
        return self._exc is None

    def exception(self):
        """The error the finished operation raised, else None."""
        return self._exc

    def result(self):
        """Alias of :meth:`wait`."""
        return self.wait()

    def get_future(self):
        """A ``torch.futures.Future`` completed, once the operation finished,
        with ``[result]`` (``[]`` for barrier and send, as torch's futures
        hold the output tensors) or with the operation's error, which C++
        consumers such as DDP receive as a real error. Completed by the
        communicator's waiter thread, which follows issue order."""
        with self._lock:
            if self._fut is None:
                from . import _futures  # torch is needed only here
                self._fut = _futures.of_work(self)
            return self._fut

    def __repr__(self):
        state = "done" if self._done else "pending"
        return "<gocoll.Work %s %s>" % (self._op, state)


class _Waiter:
    """One daemon thread per communicator that waits on works in order and
    runs their callbacks (ctypes releases the GIL while it waits).

    A callback may itself issue an operation and wait for its future
    (torch's PowerSGD hook does, in the ``then`` callbacks of its
    allreduces): a work put from this thread is therefore waited for on a
    thread of its own, or the waiter would wait for itself."""

    def __init__(self, comm):
        import queue
        self._q = queue.SimpleQueue()
        self._t = threading.Thread(target=self._loop, name="gocoll-waiter-%d" % comm.rank,
                                   daemon=True)
        self._t.start()

    def put(self, work, callback):
        if threading.current_thread() is self._t:
            threading.Thread(target=self._run, args=(work, callback), daemon=True,
                             name=self._t.name + "-nested").start()
            return
        self._q.put((work, callback))

    def stop(self):
        self._q.put(None)
        if threading.current_thread() is not self._t:
            self._t.join(timeout=60)

    def _loop(self):
        while True:
            item = self._q.get()
            if item is None:
                return
            self._run(*item)

    @staticmethod
    def _run(work, callback):
        try:
            work.wait()
        except BaseException:
            pass  # the callback inspects work.exception()
        try:
            callback(work)
        except BaseException as e:  # never kill the waiter
            print("gocoll: completion callback raised %r" % (e,), file=sys.stderr)
