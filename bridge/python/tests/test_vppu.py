"""gocoll.vppu across real processes."""

from launch import run_ranks


def test_redistribution_plans_3_ranks(library):
    res = run_ranks("redist.py", 3, timeout=90)
    for r in res:
        method, steps, bound = r.result["cyclic"]
        assert steps <= bound, r.result
        assert "holds" in r.result["maps_refused"], r.result
