"""build/bench/compare_report.py splits a run by cross-core regime: the
steps run while the VM's two vCPUs shared a cache and those run while they
did not are reported apart, and a step whose regime changed while it ran
counts in neither (the numbers are made up; the split is what is tested)."""

import os
import subprocess

from launch import PYTHON

REPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "build", "bench",
                      "compare_report.py")


def row(lib, rnd, busbw):
    # label,op,np,bytes,iters,med_us,min_us,p90_us,b2b_us,algbw,busbw,check,p99,b2b_p50,b2b_p99
    us = 4096 / busbw / 1e3
    return "%s#%d,allgather,2,4096,1000,%.3f,%.3f,%.3f,%.3f,%.4f,%.4f,ok,%.3f,%.3f,%.3f\n" % (
        lib, rnd, us, us, us, us, busbw, busbw, us, us, us)


def test_regimes_reported_apart(tmp_path):
    # round 1 near: gocoll 2x Open MPI; round 2 far: 1x; round 3: both steps
    # changed regime while they ran (0.25x if they counted anywhere).
    (tmp_path / "raw.csv").write_text(
        row("gocoll", 1, 8.0) + row("openmpi", 1, 4.0) +
        row("gocoll", 2, 3.0) + row("openmpi", 2, 3.0) +
        row("gocoll", 3, 1.0) + row("openmpi", 3, 4.0))
    (tmp_path / "corelat.csv").write_text(
        "gocoll,2,1,90,100\nopenmpi,2,1,95,101\n"
        "gocoll,2,2,410,420\nopenmpi,2,2,430,400\n"
        "gocoll,2,3,420,100\nopenmpi,2,3,100,420\n")
    (tmp_path / "meta.txt").write_text("rounds=3\nrounds_done=3\nnproc=2\n")
    r = subprocess.run([PYTHON, REPORT, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    md = (tmp_path / "results.md").read_text()
    assert "2 steps near, 2 far, 2 changed while they ran" in md, md
    near = md.index("## Cores sharing a cache")
    far = md.index("## Cores not sharing a cache")
    assert near < far
    assert "| allgather | 2 | 2.00 |" in md[near:far], md[near:far]
    assert "| allgather | 2 | 1.00 |" in md[far:], md[far:]
    assert "0.25" not in md and "0.33" not in md
