"""Under mpirun (Open MPI's variables, no torchrun ones): gocoll.init()
from OMPI_COMM_WORLD_*, then the "gocoll" torch backend with the rank and
size taken from them and MASTER_ADDR/MASTER_PORT passed with -x."""

import os

import numpy as np
import torch
import torch.distributed as dist

import gocoll
import gocoll.torch  # noqa: F401  (registers the backend)
from common import main, report


def work():
    rank, size = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
    with gocoll.init() as c:
        assert (c.rank, c.size) == (rank, size), (c.rank, c.size, rank, size)
        x = np.arange(5, dtype=np.float32) * (rank + 1)
        c.all_reduce(x)
        assert (x == np.arange(5, dtype=np.float32) * sum(range(1, size + 1))).all(), x
    dist.init_process_group("gocoll", rank=rank, world_size=size)
    t = torch.full((3,), float(rank))
    dist.all_reduce(t)
    assert t.tolist() == [float(sum(range(size)))] * 3, t
    dist.destroy_process_group()
    report({"rank": rank, "size": size, "torch": torch.__version__})


main(work)
