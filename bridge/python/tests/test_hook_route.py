"""The PyTorch routes' failure paths (workers/hook_route.py): errors in
gocoll's DDP comm hook and through Work.get_future reach DDP as gocoll's
errors, DistributedGradients names sparse gradients, and Ctrl-C interrupts
a DDP step waiting in C++ for a peer that does not come (comm hook and
"gocoll" backend). GOCOLL_TIMEOUT is longer than each job's deadline, so a
hang fails the test instead of ending with the library's timeout."""

import pytest

from launch import run_ranks

ENV = {"GOCOLL_TIMEOUT": "300s"}


def test_errors_reach_ddp(library):
    res = run_ranks("hook_route.py", 2, ["errors"], env=ENV, timeout=90)
    for r in res:
        out = r.result
        assert "gocoll" in out["hook"] and "Unable to cast" not in out["hook"]
        assert "mismatch" in out["get_future"]
        assert "sparse gradients are not supported" in out["sparse"]
    assert "aborted" in res[0].result["hook"]


@pytest.mark.parametrize("route", ["sigint-hook", "sigint-backend"])
def test_ctrl_c_interrupts_ddp_step(library, route):
    res = run_ranks("hook_route.py", 2, [route], env=ENV, timeout=90)
    assert res[0].result["outcome"] == "KeyboardInterrupt", res[0]
    assert "interrupted" in res[0].result.get("step_error", "interrupted"), res[0]
    assert "aborted" in res[1].result["peer"], res[1]
