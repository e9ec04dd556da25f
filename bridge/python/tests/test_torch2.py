"""torch 2.x on the "gocoll" backend, each against gloo in the same job
(tests/workers/torch2.py): DDP and its comm hooks, FSDP, functional
collectives, 1-D and 2-D DeviceMeshes with DTensor, distributed
checkpoints, batch_isend_irecv, the coalescing manager, new_subgroups,
split_group, destroy; torchrun with a rendezvous that needs no libuv.
Skipped on torch 1.x; CI runs them on Debian 13's torch 2.6
(build/test.sh, step pytest-torch2)."""

import os

import pytest

from launch import BRIDGE, PYTHON, WORKERS, run_cmd, run_ranks
from conftest import TORCH_MAJOR

pytestmark = pytest.mark.skipif(TORCH_MAJOR < 2, reason="torch 2.x only (this interpreter has 1.x)")

# Debian 13's torch is built without libuv; USE_LIBUV=0 selects TCPStore's
# other server (conftest sets it too; stated here for the reader).
ENV = {"USE_LIBUV": "0"}


def test_torch2_against_gloo(library, tmp_path):
    res = run_ranks("torch2.py", 4, args=[str(tmp_path)], env=ENV, timeout=300)
    for r in res:
        out = r.result
        assert out["checked"] == ["ddp", "fsdp", "functional", "meshes", "checkpoint", "groups",
                                  "destroy"], out
        for key, v in out.items():
            if key.startswith(("ddp ", "fsdp ", "dtensor ")):
                assert v <= (1e-3 if "fp16" in key else 1e-5), (r.rank, key, v)
    names = res[0].result["checkpoint files"]
    assert ".metadata" in names and any(n.endswith(".distcp") for n in names), names


def torchrun(tmp_path, nproc, script, *args):
    """Debian 13's torchrun: its static and TCP rendezvous need libuv, so
    the c10d rendezvous over a FileStore (one host, or a shared file
    system) with the store sharing off; the ranks' env:// store then takes
    USE_LIBUV=0 (docs/launching.md)."""
    cmd = [PYTHON, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
           "--rdzv-backend", "c10d", "--rdzv-endpoint", str(tmp_path / "rdzv"),
           "--rdzv-conf", "store_type=file", "--tee", "3", script] + [str(a) for a in args]
    env = dict(os.environ, OMP_NUM_THREADS="1", GOCOLL_TIMEOUT="60s", TMPDIR=str(tmp_path),
               TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
               PYTHONPATH=BRIDGE + os.pathsep + os.environ.get("PYTHONPATH", ""), **ENV)
    return run_cmd(cmd, timeout=180, env=env)


def test_backend_under_torchrun_file_rendezvous(library, tmp_path):
    """The 1.13 backend checks (tests/workers/backend.py) under torch 2.x's
    torchrun."""
    from test_backend import _check, _results
    rc, out, err = torchrun(tmp_path, 2, os.path.join(WORKERS, "backend.py"))
    assert rc == 0, out[-6000:] + err[-6000:]
    _check(_results(out), 2)


@pytest.mark.parametrize("mode", ["dg", "ddp-hook"])
def test_train_mlp_example(library, tmp_path, mode):
    rc, out, err = torchrun(tmp_path, 2, os.path.join(BRIDGE, "examples", "train_mlp.py"),
                            "--steps", "30", "--mode", mode)
    assert rc == 0, out + err
    assert "weight spread across ranks 0" in out, out + err

