"""Resource hygiene from Python: many create/destroy cycles in one process
leave threads, descriptors, /dev/shm and resident memory as they were
after a warm-up (workers/hygiene.py; the C twin is capi/ctest)."""

import os

import pytest

from launch import PYTHON, WORKERS, private_shm, run_ranks

# What may differ between the warm-up and the end without a leak: the
# process's heaps breathe by a few MiB, and the Go runtime never ends an
# idle thread, so its count is the most threads ever needed at once, which
# creeps up by one or two over thousands of cycles. A leak grows with every
# cycle.
RSS_SLACK_KIB = 6 << 10
THREADS_SLACK = 3


def cycles(default):
    """GOCOLL_TEST_CYCLES (1000 in the long run), or default."""
    try:
        n = int(os.environ.get("GOCOLL_TEST_CYCLES", ""))
        return n if n > 1 else default
    except ValueError:
        return default


def check(res, private):
    for r in res:
        warm, end = r.result["warm"], r.result["end"]
        print("rank %d: after %d cycles %s; after %d (%.1f s) %s" % (r.rank, warm["cycle"], warm, end["cycle"],
                                                                     end["seconds"], end))
        assert end["fds"] == warm["fds"], (r.rank, warm, end)
        assert end["threads"] <= warm["threads"] + THREADS_SLACK, (r.rank, warm, end)
        assert warm["memfds"] == 0 and end["memfds"] == 0, (r.rank, warm, end)
        assert end["rss_kib"] <= warm["rss_kib"] + RSS_SLACK_KIB, (r.rank, warm, end)
        if private:
            assert warm["shm"] == 0 and end["shm"] == 0, (r.rank, warm, end)


@pytest.mark.parametrize("mode", ["one", "multi"])
def test_create_destroy_cycles(library, mode, tmp_path):
    """1,000 one-rank communicators; 4 processes joining a fresh 4-rank
    communicator every cycle (GOCOLL_TEST_CYCLES, 50 by default)."""
    with private_shm() as prefix:
        cmd = (prefix or []) + [PYTHON, os.path.join(WORKERS, "hygiene.py")]
        if mode == "one":
            res = run_ranks(None, 1, cmd=cmd, args=["one", cycles(1000)], timeout=600)
        else:
            res = run_ranks(None, 4, cmd=cmd, args=["multi", cycles(50), tmp_path], timeout=1800)
        check(res, prefix is not None)
