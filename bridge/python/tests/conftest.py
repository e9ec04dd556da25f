"""Test setup: find (or build) libgocoll without loading it into the pytest
process, and make sure no test leaves a child process behind.

Every real job runs in fresh interpreters (tests/launch.py): the pytest
process never loads the library, so it can start subprocesses freely."""

import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BRIDGE = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(BRIDGE))
sys.path.insert(0, HERE)
sys.path.insert(0, BRIDGE)

from gocoll import _lib  # noqa: E402  (does not load the library)


def _torch_major():
    """The major version of the torch this interpreter (and so every rank
    it starts) has, 0 without torch; without importing it."""
    import importlib.metadata
    try:
        return int(importlib.metadata.version("torch").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return 0


TORCH_MAJOR = _torch_major()
if TORCH_MAJOR >= 2:
    # torch 2.x's TCPStore defaults to its libuv server, which Debian 13's
    # torch is built without; the other one works with every build. The
    # ranks the tests start inherit it.
    os.environ.setdefault("USE_LIBUV", "0")


def _existing_library():
    for path, _origin in _lib.candidate_paths():
        if os.sep in path and os.path.exists(path):
            return os.path.realpath(path)
    return None


@pytest.fixture(scope="session")
def library():
    """Path of libgocoll.so; built with build/build.sh when none is found.
    Exported as GOCOLL_LIBRARY so every worker loads this one."""
    path = _existing_library()
    build = os.path.join(REPO, "build", "build.sh")
    if path is None and os.path.exists(build) and shutil.which(os.environ.get("GO", "go")):
        r = subprocess.run(["sh", build], cwd=REPO, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            pytest.fail("build/build.sh failed:\n%s\n%s" % (r.stdout, r.stderr))
        path = _existing_library()
    if path is None:
        pytest.skip("libgocoll.so not found (tried %s) and could not be built"
                    % [p for p, _ in _lib.candidate_paths()])
    os.environ[_lib.LIBRARY_ENV] = path
    return path


def _children():
    me = str(os.getpid())
    kids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[1] == me and fields[0] != "Z":
            kids.append(int(pid))
    return kids


@pytest.fixture(autouse=True)
def no_leftover_processes():
    yield
    left = _children()
    assert not left, "test left child processes behind: %s" % left


@pytest.fixture(scope="session", autouse=True)
def _dump_dir(tmp_path_factory):
    """Workers that fail on purpose write flight-recorder dumps: keep them in
    the session's temp dir rather than the system's (a test may still set
    GOCOLL_DUMP_DIR for its own ranks)."""
    if "GOCOLL_DUMP_DIR" not in os.environ:
        os.environ["GOCOLL_DUMP_DIR"] = str(tmp_path_factory.mktemp("dumps"))
    yield
