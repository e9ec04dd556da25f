"""The torch.distributed backend "gocoll" (import gocoll.torch): every
collective against a local reference, new_group, Work.wait(timeout), DDP on
gocoll equal to DDP on gloo, bf16 DDP, refused inputs and a size mismatch
surfacing as exceptions (also inside DDP). Under torchrun (env://) and with
init_method="tcp://" (tests/launch.py)."""

import json
import os

import pytest

from conftest import TORCH_MAJOR
from launch import BRIDGE, PYTHON, WORKERS, free_port_pair, run_cmd, run_ranks

WORKER = os.path.join(WORKERS, "backend.py")
CHECKS = 30  # entries of the worker's "checked" list when everything ran


def _results(out):
    res = []
    for line in out.splitlines():
        _, sep, rest = line.partition("RESULT ")
        if sep and line.startswith("[default"):
            res.append(json.loads(rest))
    return res


def _check(results, n):
    assert len(results) == n
    for out in results:
        assert len(out["checked"]) == CHECKS, out["checked"]
        assert out["ddp_gocoll_vs_gloo"] <= 1e-5
        assert "mismatched collective" in out["mismatch"]
        assert "gocoll" in out["ddp_error"] and "gocoll" in out["ddp_async_error"]
        if "monitored_barrier_all" in out:  # rank 0: the odd ranks did not arrive
            want = "rank 1" if n < 4 else "ranks 1, 3"
            assert want + " did not arrive" in out["monitored_barrier_all"]
            assert "rank 1 did not arrive" in out["monitored_barrier"]


@pytest.mark.skipif(TORCH_MAJOR >= 2, reason="torch 1.x's torchrun flags; on 2.x "
                    "test_torch2.py::test_backend_under_torchrun_file_rendezvous")
@pytest.mark.parametrize("nranks", [2, 4])
def test_backend_under_torchrun(library, nranks, tmp_path):
    port = free_port_pair()
    cmd = [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", str(nranks),
           "--redirects", "1", "--tee", "1",  # Debian's 1.13 crashes without them
           "--master_addr", "127.0.0.1", "--master_port", str(port), WORKER]
    # TMPDIR: torchrun leaves a torchelastic_* directory in the temp dir.
    env = dict(os.environ, OMP_NUM_THREADS="1", GOCOLL_TIMEOUT="60s", TMPDIR=str(tmp_path),
               PYTHONPATH=BRIDGE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    rc, out, err = run_cmd(cmd, timeout=120, env=env)
    assert rc == 0, out[-6000:] + err[-6000:]
    for r in range(nranks):
        assert "BACKEND OK rank %d of %d" % (r, nranks) in out, out[-4000:]
    _check(_results(out), nranks)


def test_backend_init_method_tcp(library):
    res = run_ranks("backend.py", 3, args=["--init", "tcp"], timeout=120)
    _check([r.result for r in res], 3)
