"""Tagged sends and receives and the barriers of :class:`gocoll.Comm`."""

import ctypes
import time

from . import _buffer, errors
from ._args import MONITOR_TAG, _c_int, _timeout_ms
from ._buffer import as_buffer


class PointToPoint:
    """send, recv, isend, irecv, barrier and monitored_barrier of
    :class:`gocoll.Comm` (a mixin: it uses the communicator's ``_size``,
    ``_rank``, ``_peer``, ``_run``, ``_handle`` and ``abort``)."""

    def _tag(self, tag, op):
        t = _c_int(tag, "%s tag" % op)
        if not 0 <= t < MONITOR_TAG:
            raise errors.InvalidArgument("gocoll: %s: tag %d is outside [0, %d] (%d is reserved for "
                                         "monitored_barrier)" % (op, t, MONITOR_TAG - 1, MONITOR_TAG))
        return t

    def send(self, tensor, dst, tag=0, *, async_op=False):
        """Send ``tensor`` to rank ``dst``, whose :meth:`recv` with the same
        ``tag`` (and count and dtype) takes it. Messages to one rank leave in
        issue order; the receiver takes different tags in any order it
        likes, one tag in order. Every message must be received before the
        receiver's next collective on this communicator."""
        dst = self._peer(dst, "send dst")
        tag = self._tag(tag, "send")
        b = as_buffer(tensor, "send tensor", writable=False)
        return self._run("gocollSendTag", (b.ptr, b.count, b.dtype, dst, tag), async_op, (b.obj,),
                         None, "send")

    def recv(self, tensor, src=None, tag=0, *, async_op=False):
        """Receive into ``tensor`` the oldest message from rank ``src`` with
        ``tag`` that no earlier recv took; count and dtype must be the
        sender's (else :class:`gocoll.InvalidUsage`, never a truncated
        message). Returns ``tensor``.

        ``src=None`` receives from any source, as torch.distributed: the
        first message with ``tag`` from whichever rank sent one (each
        sender's messages in the order sent), and returns the sender's
        rank; with ``async_op`` the :class:`Work`'s ``source_rank()`` says
        it once the receive finished."""
        tag = self._tag(tag, "recv")
        b = as_buffer(tensor, "recv tensor", writable=True)
        if src is None:
            source = ctypes.c_int(-1)
            r = self._run("gocollRecvAny", (b.ptr, b.count, b.dtype, tag, ctypes.byref(source)),
                          async_op, (b.obj, source), b.obj, "recv", source=source)
            return r if async_op else source.value
        src = self._peer(src, "recv src")
        return self._run("gocollRecvTag", (b.ptr, b.count, b.dtype, src, tag), async_op, (b.obj,),
                         b.obj, "recv")

    def isend(self, tensor, dst, tag=0):
        """:meth:`send` returning a :class:`Work`."""
        return self.send(tensor, dst, tag, async_op=True)

    def irecv(self, tensor, src=None, tag=0):
        """:meth:`recv` returning a :class:`Work` (``src=None``: from any
        source; ``Work.source_rank()`` names the sender)."""
        return self.recv(tensor, src, tag, async_op=True)

    # -- barriers -------------------------------------------------------------

    def barrier(self, *, async_op=False):
        """Return once every rank called barrier."""
        return self._run("gocollBarrier", (), async_op, None, None, "barrier")

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """torch.distributed's monitored_barrier: rank 0 waits up to
        ``timeout`` (seconds or a timedelta; None: GOCOLL_TIMEOUT) for a
        message from every other rank, then releases them. A rank that did
        not arrive is named in the :class:`gocoll.Timeout` rank 0 raises —
        the first one, or every one with ``wait_all_ranks`` — and rank 0
        then aborts the communicator, so that the other ranks fail at once
        (:class:`gocoll.RemoteError`) instead of waiting for a release. Uses
        messages of tag 2**31-1 (reserved)."""
        self._handle()
        ms = _timeout_ms(timeout)
        secs = None if ms is None else ms / 1000
        one = lambda: (ctypes.c_uint8 * 1)()  # noqa: E731  (a 1-byte token)
        op = "monitored_barrier"

        def start(name, peer):
            buf = one()
            return self._run(name, (ctypes.addressof(buf), 1, _buffer.UINT8, peer, MONITOR_TAG), True,
                             (buf,), None, op)

        if self._rank != 0:
            release = start("gocollRecvTag", 0)
            arrived = start("gocollSendTag", 0)
            try:
                release.wait(secs)
            except errors.Timeout:
                if release.is_completed():
                    raise
                self.abort()
                raise errors.Timeout("gocoll: monitored_barrier on rank %d: rank 0 did not release "
                                     "this rank within %s; communicator aborted"
                                     % (self._rank, timeout), code=errors.TIMEOUT, op=op) from None
            arrived.wait()
            return None
        waits = [(r, start("gocollRecvTag", r)) for r in range(1, self._size)]
        deadline = None if secs is None else time.monotonic() + secs
        missing = []
        for r, w in waits:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
            try:
                w.wait(left)
            except errors.Timeout:
                if w.is_completed():
                    raise  # the library's own timeout (GOCOLL_TIMEOUT)
                missing.append(r)
                if not wait_all_ranks:
                    break
        if missing:
            self.abort()
            who = ("rank %d" % missing[0]) if len(missing) == 1 else \
                "ranks %s" % ", ".join(str(r) for r in missing)
            raise errors.Timeout("gocoll: monitored_barrier on rank 0: %s did not arrive within %s; "
                                 "communicator aborted" % (who, timeout), code=errors.TIMEOUT, op=op)
        for w in [start("gocollSendTag", r) for r in range(1, self._size)]:
            w.wait()
        return None
