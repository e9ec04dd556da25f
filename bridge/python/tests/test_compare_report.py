"""build/bench/compare_report.py splits a run by cross-core regime: the
steps run while the VM's two vCPUs shared a cache and those run while they
did not are reported apart, and a step whose regime changed while it ran
counts in neither (the numbers are made up; the split is what is tested)."""

import os
import subprocess

from launch import PYTHON

REPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "build", "bench",
                      "compare_report.py")


def report(out):
    """Runs the report on out and returns results.md."""
    r = subprocess.run([PYTHON, REPORT, str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return (out / "results.md").read_text()


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
    md = report(tmp_path)
    assert "2 steps near, 2 far, 2 changed while they ran" in md, md
    near = md.index("## Cores sharing a cache")
    far = md.index("## Cores not sharing a cache")
    assert near < far
    assert "| allgather | 2 | 2.00 |" in md[near:far], md[near:far]
    assert "| allgather | 2 | 1.00 |" in md[far:], md[far:]
    assert "0.25" not in md and "0.33" not in md


def test_floor_uses_cross_core_copy_rate(tmp_path):
    # A 2-rank 64 KiB allreduce: plain 4.0 µs, gocollMemAlloc 2.8 µs. Copying
    # this rank's 32 KiB in at xcopy's 32.768 GB/s takes 1.0 µs (floor 3.8:
    # plain / floor 1.05, met); at memcpy_bw's single-core 128 GB/s, 0.256 µs
    # (floor 3.056: 1.31, not met), which is what the report falls back to.
    def ar(lib, us):
        busbw = 65536 / us / 1e3
        return "%s#1,allreduce,2,65536,1000,%.3f,%.3f,%.3f,%.3f,%.4f,%.4f,ok,%.3f,%.3f,%.3f\n" % (
            lib, us, us, us, us, busbw, busbw, us, us, us)
    (tmp_path / "raw.csv").write_text(ar("gocoll", 4.0) + ar("gocoll-memalloc", 2.8) + ar("openmpi", 8.0))
    (tmp_path / "meta.txt").write_text("rounds=1\nrounds_done=1\nnproc=2\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "memcpy-r1.md").write_text(
        "| bytes | memcpy 1T GB/s | copyNT 1T GB/s |\n|------:|------:|------:|\n| 65536 | 128.00 (130.00) | 40.00 (41.00) |\n")

    def floor_row():
        md = report(tmp_path)
        rows = [l for l in md.splitlines() if "plain / floor" in l and "np=2 64 KiB" in l]
        assert len(rows) == 1, md
        return rows[0]

    row_ = floor_row()
    assert "copy-in at 128.0 GB/s, single-core memcpy" in row_ and "| 1.31 | **no** |" in row_, row_
    (logs / "xcopy-r1.md").write_text("| bytes | xcopy GB/s |\n|------:|------:|\n| 65536 | 32.768 (40.00) |\n")
    row_ = floor_row()
    assert "copy-in at 32.8 GB/s, cross-core" in row_ and "| 1.05 | yes |" in row_, row_
    assert "xcopy GB/s" in (tmp_path / "results.md").read_text()


def test_per_call_difference(tmp_path):
    # A 2-rank 4 KiB allgather behind Open MPI (0.50 against 0.36 µs, 0.72x),
    # whose one-rank call costs 0.30 µs against Open MPI's 0.05: less that
    # 0.25 µs difference it takes 0.25 µs, 1.44x.
    (tmp_path / "raw.csv").write_text(row("gocoll", 1, 4096 / 0.50 / 1e3) + row("openmpi", 1, 4096 / 0.36 / 1e3))
    (tmp_path / "percall.csv").write_text(
        "gocoll#1,allgather,1,4096,1000,0.300,0.3,0.3,0.3,1,1,ok,0.4,0.3,0.4\n"
        "openmpi#1,allgather,1,4096,1000,0.050,0.05,0.05,0.05,1,1,ok,0.1,0.05,0.1\n")
    (tmp_path / "meta.txt").write_text("rounds=1\nrounds_done=1\nnproc=2\n")
    md = report(tmp_path)
    assert "allgather np=2 4 KiB 0.72× (1.44× less the per-call difference)" in md, md
    assert "| allgather | 0.30 | 0.05 | +0.25 |" in md, md


def test_base_before_after(tmp_path):
    # BASE=: gocoll against the build of an earlier commit, three rounds.
    # 4 KiB: gocoll about 30 % above the base (its own spread 10 %): slower
    # beyond the spread, flagged. 64 KiB: gocoll 9 % above the base, within
    # gocoll's own 10 % spread, not flagged.
    def ag(lib, rnd, size, us):
        busbw = size / us / 1e3 / 2
        return "%s#%d,allgather,2,%d,1000,%.3f,%.3f,%.3f,%.3f,%.4f,%.4f,ok,%.3f,%.3f,%.3f\n" % (
            lib, rnd, size, us, us, us, us, 2 * busbw, busbw, us, us, us)
    rows = ""
    for rnd, (g4, b4, g64) in enumerate([(1.00, 0.80, 10.0), (1.10, 0.82, 11.0), (1.05, 0.81, 10.5)], 1):
        rows += ag("gocoll", rnd, 4096, g4) + ag("gocoll-base", rnd, 4096, b4)
        rows += ag("gocoll", rnd, 65536, g64) + ag("gocoll-base", rnd, 65536, 9.6)
    (tmp_path / "raw.csv").write_text(rows)
    (tmp_path / "percall.csv").write_text(
        "gocoll#1,allgather,1,4096,1000,0.250,0.25,0.25,0.25,1,1,ok,0.3,0.25,0.3\n"
        "gocoll-base#1,allgather,1,4096,1000,0.350,0.35,0.35,0.35,1,1,ok,0.4,0.35,0.4\n")
    (tmp_path / "meta.txt").write_text("rounds=3\nrounds_done=3\nnproc=2\nbase=main (abc123: old)\n"
                                       "cpu=AMD EPYC\ncpu_id=vendor id AuthenticAMD, cpu family 25\n")
    md = report(tmp_path)
    assert "BASE=main (abc123: old)" in md, md
    assert "AMD EPYC (vendor id AuthenticAMD, cpu family 25)" in md, md
    assert "| allgather | 2 | 0.77 ** | 0.91 |" in md, md
    assert "Slower than the base beyond the spread: allgather np=2 4 KiB 0.77×." in md, md
    assert "| allgather | 0.25 | 0.35 | - | - |" in md, md
