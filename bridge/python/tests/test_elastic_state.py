"""gocoll.elastic: a rank SIGKILLed in a training loop on virtual devices;
the survivors end with the state of an uninterrupted run, to the bit."""

import hashlib

import numpy as np
import pytest

from launch import run_ranks

NDEV, N, STEPS = 8, 4096, 40


def reference():
    """The same training in one process, folding the devices in order."""
    params, momentum = np.zeros(N), np.zeros(N)
    for step in range(STEPS):
        gs = [np.random.default_rng([7, d, step]).standard_normal(N) * (1 + d) + 0.01 * params for d in range(NDEV)]
        acc = gs[0].copy()
        for g in gs[1:]:
            acc += g
        acc /= NDEV
        momentum *= 0.9
        momentum += acc
        params -= 0.01 * momentum
    return hashlib.sha256(params.tobytes() + momentum.tobytes()).hexdigest()


@pytest.mark.parametrize("victim", [0, 2])
def test_killed_rank_same_state(library, victim):
    want = reference()
    res = run_ranks("elastic_state.py", 4, check=False, timeout=120,
                    env={"GOCOLL_TIMEOUT": "10s", "VICTIM": str(victim), "KILL_AT": "15"})
    assert res[victim].rc == -9, res[victim]
    for r in range(4):
        if r == victim:
            continue
        assert res[r].rc == 0, res[r]
        out = res[r].result
        assert out["sha256"] == want, (r, out)
        assert out["ranks"] == 3 and len(out["recoveries"]) == 1, out
        rec = out["recoveries"][0]
        assert rec["lost"] == [victim] and rec["resumed"] in (15, 16), rec


def test_too_few_ranks(library):
    # min_ranks=2 of 2: after the kill one rank is left, and is refused.
    res = run_ranks("elastic_state.py", 2, check=False, timeout=120,
                    env={"GOCOLL_TIMEOUT": "10s", "VICTIM": "1", "KILL_AT": "5"})
    assert res[1].rc == -9, res[1]
    assert res[0].rc != 0 and "too few processes" in res[0].stderr, res[0]


def test_no_quorum_stops_at_once(library):
    # Majority quorum, 2 of 4 ranks silent past the timeout: the shrink
    # finds no quorum. That is not a peer failure: run() must stop at once
    # with NoQuorum (before, gocollRemoteError, retried 8 times).
    res = run_ranks("elastic_state.py", 4, check=False, timeout=120,
                    env={"GOCOLL_TIMEOUT": "2s", "GOCOLL_SHRINK_QUORUM": "majority", "STOP": "1,2,10"})
    for r in (0, 3):
        assert res[r].rc == 0, res[r]
        out = res[r].result
        assert out["error"] == "NoQuorum" and not out["peer_failure"] and out["recoveries"] == [], out
    assert res[1].rc == -9 and res[2].rc == -9, res


def test_bad_joiner_refused(library, tmp_path):
    # A replacement with 9 devices asks to join a job of 8: the members
    # refuse it (it gets InvalidArgument), shrink it out and finish with
    # the reference state (before, its join made every member fail).
    want = reference()

    def per_rank(r):
        if r == 3:
            return {"ROLE": "join", "NDEV": "9", "RANK": None, "WORLD_SIZE": None, "LOCAL_RANK": None}
        return {"WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "3"}

    res = run_ranks("elastic_state.py", 4, check=False, timeout=120, per_rank_env=per_rank,
                    env={"GOCOLL_TIMEOUT": "30s", "GOCOLL_SECRET": "pytest-elastic-state",
                         "JOB_FILE": str(tmp_path / "job"), "WAIT_JOINER_AT": "10"})
    assert res[3].rc == 0 and res[3].result["error"] == "InvalidArgument", res[3]
    assert "refused" in res[3].result["detail"] and "9 devices, against 8" in res[3].result["detail"], res[3]
    for r in range(3):
        assert res[r].rc == 0, res[r]
        out = res[r].result
        assert out["sha256"] == want and out["ranks"] == 3, out
    with open(tmp_path / "job") as f:
        lines = f.read().split("\n")
    assert len(lines[1].split()) == 4 and lines[2].startswith("epoch "), lines  # the 3 members' pids


def test_superseded_view_stops(library, tmp_path):
    # The job file holds a view these ranks did not come from: their
    # publish raises Superseded (an Excluded) on every rank and leaves the
    # file as it was (before, rank 0 overwrote it and replacements joined
    # the stale view).
    res = run_ranks("elastic_state.py", 2, check=False, timeout=60,
                    env={"JOB_FILE": str(tmp_path / "job"), "ZOMBIE": "1"})
    for r in range(2):
        assert res[r].rc == 0, res[r]
        assert res[r].result == {"publish": "Superseded (an Excluded)", "file_unchanged": True}, res[r]


def _train_elastic(np_, kill=None, timeout=120, steps=120, extra=()):
    """Run examples/train_elastic.py; kill=(rank, step): SIGKILL that rank's
    process from outside once rank 0 logged that step."""
    import os
    import re
    import signal
    import subprocess
    import sys
    import threading

    from launch import BRIDGE, PYTHON

    script = os.path.join(BRIDGE, "examples", "train_elastic.py")
    p = subprocess.Popen([PYTHON, script, "-np", str(np_), "-virtual", "8", "--steps", str(steps), "--log-every", "1"] + list(extra),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines, pid = [], None
    timer = threading.Timer(timeout, lambda: os.killpg(p.pid, signal.SIGKILL))
    timer.start()
    try:
        for line in p.stdout:
            lines.append(line)
            m = re.match(r"train_elastic: rank (\d+) is pid (\d+)", line)
            if kill and m and int(m.group(1)) == kill[0]:
                pid = int(m.group(2))
            m = re.match(r"step (\d+) loss", line)
            if kill and pid and m and int(m.group(1)) >= kill[1]:
                os.kill(pid, signal.SIGKILL)
                pid = None
        rc = p.wait()
    finally:
        timer.cancel()
    out = "".join(lines)
    m = re.search(r"^weights sha256 ([0-9a-f]{64})$", out, re.M)
    return rc, (m.group(1) if m else None), out


def test_train_elastic_killed_rank(library):
    rc, want, out = _train_elastic(1)
    assert rc == 0 and want, out
    rc, got, out = _train_elastic(4, kill=(1, 30))
    assert rc == 0 and got == want, out
    assert "rank 1 died (SIGKILL)" in out and "lost rank(s) [1]" in out, out
    assert out.rstrip().splitlines()[-2].startswith("weights sha256"), out


def test_train_elastic_respawn(library):
    # Enough steps for a fresh interpreter to import torch and join.
    rc, want, out = _train_elastic(1, steps=800)
    assert rc == 0 and want, out
    rc, got, out = _train_elastic(4, kill=(2, 20), steps=800, extra=["--respawn"])
    assert rc == 0 and got == want, out
    assert "admitted 1 process(es); 4 go on" in out, out
