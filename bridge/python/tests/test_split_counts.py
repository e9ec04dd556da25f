"""The one conversion of torch's split sizes (rows of dim 0) into element
counts per rank, shared by Comm.all_to_all_single and the torch backend's
all_to_all_single; and the split of gocoll.comm keeping its names. Runs in
the pytest process: nothing here loads the library."""

import numpy as np
import pytest

from gocoll import comm, errors
from gocoll._alltoall import split_counts


def test_equal_splits_count_whole_rows():
    assert split_counts(np.zeros((4, 3)), None, 2, "op", "input") == [6, 6]
    assert split_counts(np.zeros((4, 3)), [], 4, "op", "input") == [3, 3, 3, 3]
    assert split_counts(np.zeros(()), None, 1, "op", "input") == [1]
    assert split_counts(np.zeros((0, 5)), None, 3, "op", "input") == [0, 0, 0]


def test_uneven_splits_scale_by_row_length():
    assert split_counts(np.zeros((5, 2)), [1, 0, 4], 3, "op", "input") == [2, 0, 8]
    assert split_counts(np.zeros((5, 2)), (np.int64(2), 3), 2, "op", "output") == [4, 6]


def test_torch_tensor_counts_like_numpy():
    torch = pytest.importorskip("torch")
    assert split_counts(torch.zeros(5, 2), [1, 4], 2, "op", "input") == [2, 8]
    assert split_counts(torch.zeros(4, 3), None, 2, "op", "input") == [6, 6]


@pytest.mark.parametrize("shape, splits, n, words", [
    ((3, 2), None, 2, "3 rows, not divisible by the 2 ranks"),
    ((4,), [1, 2], 2, "must be 2 non-negative row counts adding up to its 4 rows"),
    ((4,), [1, 1, 2], 2, "must be 2 non-negative"),
    ((4,), [5, -1], 2, "non-negative"),
    ((4,), [2.0, 2], 2, "split sizes must be integers"),
])
def test_bad_splits_refused_with_op_and_side(shape, splits, n, words):
    with pytest.raises(errors.InvalidArgument) as e:
        split_counts(np.zeros(shape), splits, n, "all_to_all_single", "output")
    assert words in str(e.value)
    assert str(e.value).startswith("gocoll: all_to_all_single: output")


def test_comm_keeps_its_names():
    # gocoll.comm was split by concern; what callers import from it stays.
    for name in ("Comm", "Work", "MemBlock", "ReduceOp", "DataType", "init", "join",
                 "get_unique_id", "version", "MONITOR_TAG", "_check_call", "_op"):
        assert hasattr(comm, name), name
    for method in ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor",
                   "all_gather_coalesced", "reduce_scatter", "reduce_scatter_tensor",
                   "all_to_all_single", "all_to_all", "alltoallv", "alltoallw", "send", "recv",
                   "isend", "irecv", "barrier", "monitored_barrier", "split", "shrink", "destroy",
                   "abort", "on_complete", "mem_alloc"):
        assert callable(getattr(comm.Comm, method)), method
