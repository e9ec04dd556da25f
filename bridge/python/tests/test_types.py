"""int16 and bool, the bitwise ops BAND/BOR/BXOR, and per-communicator
settings (gocoll.init(timeout=, algo=, debug=); the torch backend passing a
group's timeout), on numpy arrays and through init_process_group("gocoll")."""

from launch import run_ranks

# 7 bool ops x (allreduce, reduce_scatter), 3 bitwise ops x 7 integer types,
# 4 int16 checks, refusals, bad settings, the two timeouts
NUMPY_CHECKS = 7 * 2 + 3 * 7 + 4 + 1 + 1 + 1
# 3 bitwise ops x 5 integer dtypes, 7 bool ops, refusals, the group timeouts
TORCH_CHECKS = 3 * 5 + 7 + 1 + 1


def _check(results, n, want):
    assert len(results) == n
    for res in results:
        assert "TYPES OK rank %d of %d" % (res.rank, n) in res.stdout, res
        assert len(res.result["checked"]) == want, res.result["checked"]


def test_numpy_types_ops_and_settings(library):
    _check(run_ranks("dtypes.py", 3, ["numpy"], timeout=90), 3, NUMPY_CHECKS)


def test_numpy_two_ranks_tcp(library):
    _check(run_ranks("dtypes.py", 2, ["numpy"], env={"GOCOLL_TRANSPORT": "tcp"}, timeout=90), 2,
           NUMPY_CHECKS)


def test_torch_backend_bitwise_bool_and_timeout(library):
    _check(run_ranks("dtypes.py", 3, ["torch"], timeout=120), 3, TORCH_CHECKS)
