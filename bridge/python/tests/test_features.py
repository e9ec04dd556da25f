"""Async overlap, buffer lifetime, zero copy, refused inputs, library
errors as exceptions, fork safety, explicit rendezvous, atexit."""

import os
import time

import pytest

from launch import BRIDGE, PYTHON, WORKERS, run_cmd, run_ranks


def test_async_zero_copy_and_bad_inputs(library):
    res = run_ranks("features.py", 2, timeout=120)
    r0 = res[0].result
    # the non-blocking call returned while rank 1 had not joined
    assert r0["overlap"]["issue_s"] < 0.5
    assert r0["overlap"]["spins_during_wait"] > 10
    # no Python allocation of the buffer's size (32 MiB) during the calls
    assert r0["tracemalloc_peak"] < 1 << 20
    assert r0["torch_allocated"] < 1 << 20  # torch.profiler(profile_memory=True)
    msgs = r0["messages"]
    assert "contiguous" in msgs["noncontig numpy"] and "contiguous" in msgs["noncontig torch"]
    assert "read-only" in msgs["read-only"]
    assert "does not support" in msgs["dtype"]
    # errors found by the library carry gocollGetLastError's text
    assert "overlap" in msgs["library overlap"]
    assert "self" in msgs["library send to self"]
    # Work.wait(timeout) gave up while the receive could not finish; a
    # future's error is gocoll's
    assert "did not finish within 0.2" in r0["work"]["wait_timeout"]
    assert "gocoll" in r0["work"]["future_error"]
    # comm.topology(): both ranks on this host, its hardware detected
    assert r0["topology"] == {"hosts": 1, "source": "hwloc"} or r0["topology"]["source"] == "sys"


def test_failures_become_exceptions(library):
    res = run_ranks("failures.py", 2, env={"GOCOLL_TIMEOUT": "3s"}, timeout=90)
    r0, r1 = res[0].result, res[1].result
    assert "mismatch" in r0["mismatch"] and "mismatch" in r1["mismatch"]
    assert "timed out" in r0["timeout"] and 2.0 < r0["timeout_s"] < 30
    assert r0["aborted_wait"].startswith("InvalidUsage")
    assert "aborted" in r1["peer_aborted"]
    assert r1["after_peer_timeout"].startswith(("RemoteError", "InvalidUsage"))


def test_unique_id_and_exit_with_live_communicator(library, tmp_path):
    t0 = time.monotonic()
    res = run_ranks("uid.py", 3, [tmp_path / "uid"], timeout=60)
    assert time.monotonic() - t0 < 30
    for r in res:
        assert r.result["library"] == library
        assert r.result["version"] >= 100
        assert r.result["pending"] == 1
        assert r.stderr == "", r.stderr


def test_multiprocessing_spawn(library):
    """The documented way to start workers from Python: the 'spawn' context."""
    rc, out, err = run_cmd([PYTHON, os.path.join(WORKERS, "spawn_pool.py")], timeout=90,
                           env=dict(os.environ, PYTHONPATH=BRIDGE))
    assert rc == 0, out + err
    assert "RESULT [3.0, 3.0]" in out, out


LAUNCHERS = {
    # torchrun's variables are what run_ranks sets by default
    "torchrun": lambda r, n, port: {},
    "openmpi": lambda r, n, port: {"OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": str(n),
                                   "OMPI_COMM_WORLD_LOCAL_RANK": str(r),
                                   "GOCOLL_ROOT_ADDR": "127.0.0.1:%d" % port},
    "slurm": lambda r, n, port: {"SLURM_PROCID": str(r), "SLURM_NTASKS": str(n), "SLURM_LOCALID": str(r),
                                 "GOCOLL_ROOT_ADDR": "127.0.0.1:%d" % port},
    "plain": lambda r, n, port: {"GOCOLL_RANK": str(r), "GOCOLL_SIZE": str(n),
                                 "GOCOLL_ROOT_ADDR": "127.0.0.1:%d" % port},
}


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_init_from_launcher_environment(library, launcher):
    from launch import free_port_pair
    port = free_port_pair() + 1
    n = 3

    def env(r):
        e = {"EXPECT_RANK": str(r), "EXPECT_SIZE": str(n)}
        if launcher != "torchrun":
            for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
                e[k] = None
        e.update(LAUNCHERS[launcher](r, n, port))
        return e

    res = run_ranks("envinit.py", n, per_rank_env=env, timeout=60)
    assert [x.result["rank"] for x in res] == list(range(n))


def test_ctrl_c_interrupts_a_blocking_call(library):
    res = run_ranks("interrupt.py", 2, env={"GOCOLL_TIMEOUT": "60s"}, timeout=90)
    r0, r1 = res[0].result, res[1].result
    assert r0["installed"] and r1["installed"]
    assert r0["outcome"] == "KeyboardInterrupt", r0
    assert r0["seconds"] < 4, r0  # neither GOCOLL_TIMEOUT nor rank 1 joining (at 6 s)
    assert "abort" in r0["afterwards"].lower(), r0
    assert r0["own_handler"] == "ran", r0
    assert "abort" in r1["peer"].lower(), r1
