"""bench/ddp_bench.py end to end at its smallest: every route and the
floor's routes run, the report has both tables, and the routes that train
agree with DDP on Gloo (the numbers themselves are the benchmark's, not
the test's)."""

import json
import os
import subprocess

from launch import PYTHON

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench",
                     "ddp_bench.py")


def test_ddp_bench_smoke(library, tmp_path):
    out = tmp_path / "torch.md"
    r = subprocess.run([PYTHON, BENCH, "--ranks", "2", "--models", "cnn", "--batches", "8",
                        "--rounds", "1", "--steps", "1", "--out", str(out)],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, GOCOLL_LIBRARY=library))
    assert r.returncode == 0, r.stdout + r.stderr
    report = out.read_text()
    assert "| 2 | cnn | 8 |" in report
    assert "floor, DDP routes" in report and "slowest rank" in report
    data = json.loads((tmp_path / "torch.json").read_text())["ranks"]["2"]
    ms = data["cells"][0]["median_ms"]
    assert set(ms) == {"none", "ddp-gloo", "ddp-gocoll", "hook", "dg", "ddp-noop", "sync",
                       "allreduce", "allreduce-plain"}
    assert all(v > 0 for v in ms.values()), ms
    assert set(data["weights"]["cnn"]) == {"ddp-gocoll", "hook", "dg"}
    assert all(v <= 1e-5 for v in data["weights"]["cnn"].values()), data["weights"]
