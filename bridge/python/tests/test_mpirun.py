"""Ranks started by Open MPI's mpirun (4.1 with Debian 12's torch 1.13,
5.0 in the Debian 13 tree with torch 2.6): gocoll.init() from Open MPI's
variables, and the "gocoll" torch backend (docs/launching.md)."""

import json
import os
import re
import shutil

import pytest

from launch import BRIDGE, PYTHON, WORKERS, free_port_pair, run_cmd


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun not installed")
def test_mpirun_init_and_backend(library, tmp_path):
    port = free_port_pair()
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "3",
           "-x", "MASTER_ADDR=127.0.0.1", "-x", "MASTER_PORT=%d" % port, "-x", "USE_LIBUV=0",
           "-x", "GOCOLL_LIBRARY", "-x", "GOCOLL_TIMEOUT=60s", "-x", "OMP_NUM_THREADS=1",
           "-x", "PYTHONPATH=%s%s%s" % (BRIDGE, os.pathsep, WORKERS),
           PYTHON, os.path.join(WORKERS, "mpi.py")]
    # TMPDIR: Open MPI keeps its session directory there.
    env = dict(os.environ, TMPDIR=str(tmp_path))
    rc, out, err = run_cmd(cmd, timeout=120, env=env)
    assert rc == 0, out[-4000:] + err[-4000:]
    # (Open MPI forwards the ranks' output interleaved, lines may run together)
    got = sorted(json.loads(m)["rank"] for m in re.findall(r"RESULT (\{[^}]*\})", out))
    assert got == [0, 1, 2], out[-4000:]
