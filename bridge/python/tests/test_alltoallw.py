"""Comm.alltoallw: strided vectors on both sides, numpy and torch,
blocking and async, through pairwise exchange, aggregation and the control
tree; bad block types; ranks whose block sizes differ."""

import pytest

from launch import run_ranks


@pytest.mark.parametrize("algo", ["pairwise", "aggregate", "aggregate-tree"])
def test_alltoallw_strided(library, algo):
    res = run_ranks("alltoallw.py", 4, env={"GOCOLL_ALGO": "alltoallw=" + algo}, timeout=120)
    for rr in res:
        assert rr.result["checked"] == 12
        msgs = rr.result["messages"]
        assert "(count, blocklen, stride)" in msgs["short vector"]
        assert "overlap" in msgs["overlapping runs"]
        assert "reach element" in msgs["past the end"]
    # The sizes travel with the blocks: the rank that finds the difference
    # names both ranks; the others fail too or finished their part.
    r0 = res[0].result["messages"]["counts differ"]
    if algo == "pairwise":
        assert "mismatch" in r0
    else:
        assert "counts differ between ranks: rank 3 sends 8 bytes to rank 0, which expects 4" in r0
