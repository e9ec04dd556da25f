"""comm.dump_state(): a few collectives, then each rank writes its dump.
Run with 2 ranks and GOCOLL_DUMP_DIR set."""

import json
import os

import numpy as np

import gocoll
from common import main, report


def work():
    with gocoll.init() as c:
        x = np.ones(1000, dtype=np.float32)
        for _ in range(3):
            c.all_reduce(x)
        c.barrier()
        path = c.dump_state()
        with open(path) as f:
            d = json.load(f)
        report({"path": path, "rank": c.rank, "dump_rank": d["rank"], "size": d["size"],
                "pid_ok": d["pid"] == os.getpid(), "reason": d["reason"],
                "ops": [(r["op"], r["seq"], r["state"], r["bytes"], r.get("datatype")) for r in d["records"]],
                "in_flight": d["in_flight"]})


main(work)
