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
