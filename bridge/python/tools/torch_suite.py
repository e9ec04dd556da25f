#!/usr/bin/env python3
"""torch's own distributed test suite on the gocoll backend.

Runs ``TestDistBackend`` of ``torch.testing._internal.distributed.
distributed_test`` the way torch's ``test/distributed/test_distributed_spawn.py``
runs it for Gloo (every test spawns WORLD_SIZE fresh processes), with gocoll
loaded as a plugin backend: ``import gocoll.torch`` registers "gocoll" with
torch.distributed in this process and, since the spawned ranks import this
file again, in every rank.

    GOCOLL_LIBRARY=$PWD/build/out/lib/libgocoll.so PYTHONPATH=bridge/python \\
        /usr/bin/python3 bridge/python/tools/torch_suite.py [unittest args, e.g. -k any_source]

torch 2.6 in a Debian 13 tree (build/deps.sh trixie DIR):

    GOCOLL_LIBRARY=$PWD/build/out/lib/libgocoll.so bridge/python/tools/in_tree.sh DIR \\
        python3 bridge/python/tools/torch_suite.py

BACKEND (default gocoll) and WORLD_SIZE (default 3) are read from the
environment, as torch's script reads them; TEMP_DIR defaults to a fresh
temporary directory. The whole suite takes minutes (each test starts
WORLD_SIZE Python processes that import torch), so it is not part of the
default pytest run; bridge/python/README.md quotes its last counts.
"""

import importlib.util
import os
import sys
import tempfile
import types
import unittest

os.environ.setdefault("BACKEND", "gocoll")
os.environ.setdefault("WORLD_SIZE", "3")
if "TEMP_DIR" not in os.environ:
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="gocoll-torch-suite-")
# The ranks must not wait the default 5 minutes on a test that went wrong.
os.environ.setdefault("GOCOLL_TIMEOUT", "120s")
# torch 2.x's TCPStore defaults to its libuv server, which Debian 13's torch
# lacks; the other one works with every build (1.13 ignores the variable).
os.environ.setdefault("USE_LIBUV", "0")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# torch's test utilities import expecttest (a test-only dependency that
# Debian's torch does not pull in) only for a TestCase base class with
# inline-expectation asserts, which the distributed suite does not use.
if importlib.util.find_spec("expecttest") is None:
    _shim = types.ModuleType("expecttest")
    _shim.TestCase = unittest.TestCase
    _shim.ACCEPT = False
    sys.modules["expecttest"] = _shim

import gocoll.torch  # noqa: E402,F401  (registers the "gocoll" backend)
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402
from torch.testing._internal.common_utils import run_tests  # noqa: E402

# torch's suite turns on DDP with ReplicatedTensor in every rank, which
# imports torch.distributed._shard; Debian's torch 1.13 cannot import it on
# Python 3.11 (a dataclass field with a mutable default), so every DDP test
# would fail there for every backend, gloo included. Where that import
# fails, DDP stays as torch ships it (ReplicatedTensor off).
try:
    import torch.distributed._shard  # noqa: E402,F401
except ValueError:
    import torch.nn.parallel._replicated_tensor_ddp_utils as _rt  # noqa: E402
    _rt._set_ddp_with_replicated_tensor = lambda value: None

# What torch's suite knows of a backend is in these sets; a plugin backend
# declares itself (as ucc is listed): a plugin (its tests that switch a
# group to another backend use gloo), and DDP, which gocoll runs on CPU
# tensors (the DDP tests that need CUDA devices still skip themselves).
# gocoll is not listed for "gpu", "cuda" or "subgroup" (subgroups on CUDA
# devices): it has no CUDA path.
DistTestCases.backend_feature["plugin"].add(os.environ["BACKEND"])
DistTestCases.backend_feature["ddp"].add(os.environ["BACKEND"])

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest, TestDistBackend)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    run_tests()
