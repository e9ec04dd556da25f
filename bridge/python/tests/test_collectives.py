"""Every collective × every dtype, numpy and torch, blocking and async, on
real multi-process jobs (torchrun-style environment)."""

from launch import run_ranks

TORCH_DTYPES = 9  # int8 uint8 int16 int32 int64 float16 bfloat16 float32 float64
NUMPY_DTYPES = 10  # int8 uint8 int16 int32 uint32 int64 uint64 float16 float32 float64


def _checked(results):
    counts = [r.result["checked"] for r in results]
    assert all(c == counts[0] for c in counts[:-1])
    return counts[0]


def test_every_collective_numpy_and_torch_4_ranks(library):
    res = run_ranks("collectives.py", 4, ["both"], timeout=120)
    counts = _checked(res)
    # at least 31 checks per dtype at 4 ranks (4 all_reduce ops, prod, out and
    # input, reduce, 2 broadcast, 2 all_gather_into_tensor, 4 all_gather list,
    # 2 reduce_scatter_tensor, reduce_scatter list and tensor input, 2
    # all_to_all_single, 4 all_to_all list, alltoallv, isend/irecv, 2 tagged
    # recvs, blocking pair) on every rank
    assert counts["numpy"] >= 31 * NUMPY_DTYPES
    assert counts["torch"] >= 31 * TORCH_DTYPES
    assert counts["numpy-async"] == counts["numpy"]
    assert counts["torch-async"] == counts["torch"]


def test_non_power_of_two_ranks(library):
    _checked(run_ranks("collectives.py", 3, ["numpy"], timeout=90))


def test_single_rank(library):
    _checked(run_ranks("collectives.py", 1, ["numpy"], timeout=60))


def test_tcp_transport(library):
    _checked(run_ranks("collectives.py", 2, ["numpy"], env={"GOCOLL_TRANSPORT": "tcp"}, timeout=90))
