"""``torch.futures.Future`` objects whose errors reach C++ consumers.

torch 1.13's ``Future.set_exception`` stores the exception as a *value*: a
C++ consumer (DDP's reducer) then fails with "Unable to cast … to Tensor" or
worse, instead of seeing the error. A future completed by a ``then``
callback that raises is marked with a real error carrying the callback's
message, so every future gocoll hands out is the ``then`` of one completed
here: :func:`pair` returns both ends.
"""

import torch


def _unwrap(fut):
    try:
        return fut.wait()
    except Exception as e:
        # Raised here, torch records a real error. Without the traceback of
        # the stored exception, whose frames torch would append to the
        # message ("At: …"), only this one's remains.
        raise e.with_traceback(None)


def pair():
    """(base, public): complete ``base`` with ``set_result`` or
    ``set_exception``; hand out ``public``, which completes with base's value
    or fails with base's exception as a real error."""
    base = torch.futures.Future()
    return base, base.then(_unwrap)


def of_work(work, value=None):
    """The public future of a :class:`gocoll.Work`: completed by its
    communicator's waiter thread with ``value`` (default: ``[result]``, or
    ``[]`` when the operation has no result buffer), or with its error."""
    base, public = pair()

    def done(w):
        exc = w.exception()
        if exc is not None:
            base.set_exception(exc)
        elif value is not None:
            base.set_result(value)
        else:
            res = w._result
            base.set_result([] if res is None else [res])

    work._comm.on_complete(work, done)
    return public
