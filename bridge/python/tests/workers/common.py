"""Helpers shared by the worker scripts (run as separate processes)."""

import json
import os
import sys
import traceback


def report(obj):
    """Print the worker's result for the test (parsed by launch.RankResult)."""
    print("RESULT " + json.dumps(obj), flush=True)


def rank_size():
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def expect_raises(exc_types, fn, *args, contains=None, **kwargs):
    """Call fn and return the exception it raised; fail unless it is one of
    exc_types (and its message contains ``contains``)."""
    try:
        fn(*args, **kwargs)
    except exc_types as e:
        if contains is not None and contains.lower() not in str(e).lower():
            raise AssertionError("%r does not mention %r" % (e, contains))
        return e
    except Exception as e:
        raise AssertionError("%s raised %r, expected %s\n%s" % (
            getattr(fn, "__name__", fn), e, exc_types, traceback.format_exc()))
    raise AssertionError("%s did not raise %s" % (getattr(fn, "__name__", fn), exc_types))


def hard_exit(code):
    """os._exit(code), after removing the directory torch makes in the temp
    dir when torch.distributed.nn is imported (torch 2.x's DDP imports it):
    only an orderly exit removes it, and the tests' temp dir must end
    empty."""
    inst = sys.modules.get("torch.distributed.nn.jit.instantiator")
    tmp = getattr(inst, "_TEMP_DIR", None)
    if tmp is not None:
        tmp.cleanup()
    os._exit(code)


def main(fn):
    try:
        fn()
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        hard_exit(1)
