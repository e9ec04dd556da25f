"""PyTorch integration: equivalence of data-parallel training with one
process, DistributedGradients details, and the torchrun example."""

import os

import pytest

from conftest import TORCH_MAJOR
from launch import BRIDGE, free_port_pair, run_cmd, run_ranks

TOL = 1e-5


def test_training_equivalence_4_ranks(library):
    """20 SGD+momentum steps on 4 ranks: DistributedGradients, DDP(gloo) with
    gocoll's comm hook, and plain DDP(gloo) all match one process on the
    concatenated batch (max over parameters of max|Δ|/max|ref| ≤ 1e-5)."""
    res = run_ranks("train_equiv.py", 4, timeout=150)
    for r in res:
        out = r.result
        for key in ("dg_vs_single", "ddp_hook_vs_single", "ddp_gloo_vs_single", "dg_vs_ddp_gloo",
                    "ddp_hook_vs_ddp_gloo", "unused_vs_single", "unused_none_vs_single"):
            assert out[key] <= TOL, (r.rank, key, out[key])
        assert out["dg_rank_spread"] == 0.0
        # buckets were started while backward was still running
        assert out["dg_buckets_launched_during_backward"] > 0


def test_distributed_gradients_details(library):
    res = run_ranks("dg_features.py", 2, timeout=90)
    assert "synchronize" in res[0].result["double_backward"]


@pytest.mark.skipif(not os.path.exists("/usr/bin/torchrun"), reason="Debian's torchrun not installed")
@pytest.mark.skipif(TORCH_MAJOR >= 2, reason="torch 1.x's torchrun flags and rendezvous; on 2.x "
                    "test_torch2.py::test_train_mlp_example")
@pytest.mark.parametrize("mode", ["dg", "ddp-hook"])
def test_torchrun_example(library, mode, tmp_path):
    port = free_port_pair()
    cmd = ["/usr/bin/torchrun", "--nproc_per_node", "2", "--redirects", "1", "--tee", "1",
           "--master_addr", "127.0.0.1", "--master_port", str(port),
           os.path.join(BRIDGE, "examples", "train_mlp.py"), "--steps", "30", "--mode", mode]
    # TMPDIR: torchrun leaves a torchelastic_* directory in the temp dir.
    env = dict(os.environ, OMP_NUM_THREADS="1", GOCOLL_TIMEOUT="60s", TMPDIR=str(tmp_path))
    rc, out, err = run_cmd(cmd, timeout=150, env=env)
    assert rc == 0, out + err
    assert "weight spread across ranks 0" in out, out + err
