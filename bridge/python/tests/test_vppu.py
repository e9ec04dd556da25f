"""gocoll.vppu across real processes."""

from launch import run_ranks


def test_redistribution_plans_3_ranks(library):
    res = run_ranks("redist.py", 3, timeout=90)
    for r in res:
        method, steps, bound = r.result["cyclic"]
        assert steps <= bound, r.result
        assert "holds" in r.result["maps_refused"], r.result


def test_virtual_devices_migrate_4_to_2(library):
    res = run_ranks("vcomm.py", 4, timeout=90)
    assert [r.result["before"] for r in res] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [r.result["after"] for r in res] == [[0, 1, 2, 3], [4, 5, 6, 7], [], []]
