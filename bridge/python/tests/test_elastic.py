"""Revoke, shrink, failed ranks and grow across real processes
(docs/elastic.md)."""

import os

from launch import run_ranks


def test_killed_rank_shrink_and_grow(library, tmp_path):
    victim = 2
    join_file = str(tmp_path / "join")

    def per_rank(r):
        if r == 4:  # the replacement: no launcher variables, joins by the file
            return {"ROLE": "join", "RANK": None, "WORLD_SIZE": None, "LOCAL_RANK": None}
        return {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}

    res = run_ranks("elastic.py", 5, check=False, timeout=120, per_rank_env=per_rank,
                    env={"GOCOLL_TIMEOUT": "10s", "GOCOLL_SECRET": "pytest-elastic", "VICTIM": str(victim),
                         "JOIN_FILE": join_file})
    assert res[victim].rc == -9, res[victim]
    for r in (0, 1, 3, 4):
        assert res[r].rc == 0, res[r]
    for r in (0, 1, 3):
        out = res[r].result
        assert out["size"] == 3 and out["rank"] == r - (r > victim), out
        assert out["failed"] == [victim], out
        assert out["grown"] == 4, out
        assert "Error" in out["error"] or "Timeout" in out["error"] or "Revoked" in out["error"], out
    assert res[4].result == {"role": "joiner", "rank": 3, "size": 4}, res[4]
