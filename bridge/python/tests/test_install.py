"""The documented install, offline, on Debian's /usr/bin/python3: a venv
that sees the system's packages (torch, numpy, setuptools, wheel), pip with
no package index and no build isolation, and the installed package finding
the library it ships — from outside the source tree, with no GOCOLL_LIBRARY
and no PYTHONPATH."""

import os

import pytest

from launch import BRIDGE, PYTHON, run_cmd

REPO = os.path.dirname(os.path.dirname(BRIDGE))
CHECK = """
import numpy as np
import gocoll
import gocoll.torch  # registers the torch.distributed backend
assert "site-packages" in gocoll.__file__, gocoll.__file__
c = gocoll.init(rank=0, size=1, unique_id=gocoll.get_unique_id())
x = np.arange(4, dtype=np.float32)
c.all_reduce(x)
assert x.tolist() == [0.0, 1.0, 2.0, 3.0], x
c.destroy()
print("LIBRARY", gocoll.library_path())
"""


@pytest.mark.skipif(not os.path.exists(PYTHON) or PYTHON != "/usr/bin/python3",
                    reason="Debian's /usr/bin/python3 is what the install documents")
def test_offline_install_in_venv(library, tmp_path):
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GOCOLL_LIBRARY")}
    rc, out, err = run_cmd([PYTHON, "-m", "venv", "--system-site-packages", str(venv)], timeout=120,
                           env=env, cwd=str(tmp_path))
    assert rc == 0, out + err
    py = str(venv / "bin" / "python")
    build_env = dict(env)
    if os.path.realpath(library) != os.path.realpath(os.path.join(REPO, "build", "out", "lib",
                                                                  "libgocoll.so")):
        build_env["GOCOLL_WHEEL_LIBRARY"] = library  # a library built elsewhere: ship that one
    rc, out, err = run_cmd([py, "-m", "pip", "install", "--no-index", "--no-build-isolation",
                            "--disable-pip-version-check", BRIDGE], timeout=300, env=build_env,
                           cwd=str(tmp_path))
    assert rc == 0, out + err
    assert "linux_" in out + err, "the wheel should carry the library and a platform tag:\n" + out
    rc, out, err = run_cmd([py, "-c", CHECK], timeout=120, env=env, cwd=str(tmp_path))
    assert rc == 0, out + err
    lib = out.split("LIBRARY ", 1)[1].strip()
    assert lib.startswith(str(venv)), lib
