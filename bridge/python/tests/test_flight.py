"""The flight recorder from Python: comm.dump_state()."""

import os

from launch import run_ranks


def test_dump_state(library, tmp_path):
    res = run_ranks("dump_state.py", 2, env={"GOCOLL_DUMP_DIR": str(tmp_path)}, timeout=90)
    paths = set()
    for r in res:
        d = r.result
        assert os.path.dirname(d["path"]) == str(tmp_path)
        assert os.path.basename(d["path"]).startswith("gocoll-dump-")
        assert "-r%d-" % d["rank"] in os.path.basename(d["path"])
        assert d["dump_rank"] == d["rank"] and d["size"] == 2 and d["pid_ok"]
        assert d["reason"] == "request" and d["in_flight"] == []
        ops = [tuple(o) for o in d["ops"]]
        assert ("allreduce", 0, "ok", 4000, "float32") in ops, ops
        assert ops[-1][0] == "barrier" and ops[-1][2] == "ok", ops
        paths.add(d["path"])
    assert len(paths) == 2
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in paths)
