"""gocoll.init() from a launcher's variables; EXPECT_RANK/EXPECT_SIZE say
what it should find."""

import os

import numpy as np

import gocoll
from common import main, report


def work():
    rank, size = int(os.environ["EXPECT_RANK"]), int(os.environ["EXPECT_SIZE"])
    with gocoll.init() as c:
        assert (c.rank, c.size) == (rank, size), (c.rank, c.size, rank, size)
        x = np.array([rank], dtype=np.int64)
        c.all_reduce(x)
        assert x[0] == sum(range(size))
    report({"rank": rank})


main(work)
