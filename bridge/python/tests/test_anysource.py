"""Receives from any source (Comm.recv(src=None), irecv + source_rank())
with senders racing, and all_gather_coalesced with mixed sizes, dtypes,
empty and non-contiguous tensors against all_gather per tensor: across
processes, over shared memory and over TCP."""

import pytest

from launch import run_ranks

WANT = ["recv from any source", "source_rank refused for a named recv"]


@pytest.mark.parametrize("lib,transport", [("numpy", "auto"), ("torch", "auto"), ("numpy", "tcp")])
def test_any_source_and_coalesced(library, lib, transport):
    res = run_ranks("anysource.py", 3, [lib], env={"GOCOLL_TRANSPORT": transport}, timeout=90)
    for r in res:
        assert r.result["checked"] == WANT + ["all_gather_coalesced " + lib,
                                              "all_gather_coalesced edges " + lib], r.result
