"""multiprocessing with the 'spawn' start method: the parent made the unique
id (so it loaded libgocoll and runs the rendezvous); its children are fresh
interpreters, which is safe. ('fork' would copy a process whose Go runtime
does not survive fork.)"""

import multiprocessing as mp

import gocoll


def child(rank, size, uid, q):
    import numpy as np
    with gocoll.init(rank=rank, size=size, unique_id=uid) as c:
        x = np.array([rank + 1.0])
        c.all_reduce(x)
    q.put((rank, float(x[0])))


if __name__ == "__main__":
    uid = gocoll.get_unique_id()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=child, args=(r, 2, uid, q)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = sorted(q.get(timeout=60) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    print("RESULT", [v for _, v in got], flush=True)
