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
