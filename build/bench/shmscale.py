#!/usr/bin/python3
"""Measure what a one-host job of N rank processes costs in shared memory.

    build/bench/shmscale.py BENCH N [gocoll-bench flags...]

runs `BENCH -procs N flags...` (BENCH: a built engine/cmd/gocoll-bench;
every rank on this host, the auto transport: shared memory) with
GOCOLL_DEBUG=DEBUG, and while it runs samples every rank's descriptors
(/proc/PID/fd), mappings (/proc/PID/maps), resident memory
(/proc/PID/status, smaps_rollup), and for three ranks the memory files of the shm
transport (gocoll-<tag>-<rank>) and of the arena (gocoll-arena-...) per
mapping (/proc/PID/smaps: virtual size and resident pages, own segment and
the peers'), plus the host's Shmem and PageTables (/proc/meminfo) above
what they were before. After the job it reads the children's rusage
(CPU, minor faults) and the setup times from the ranks' logs (launch to
the last "connected"), checks that /dev/shm holds nothing new and that
Shmem fell back, and prints one JSON object.

Figures of memory, pages, descriptors and mappings do not depend on the
machine's load; times do. Report the load (printed: load average before).
"""
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone


def meminfo():
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            out[k] = int(v.split()[0]) * 1024
    return out


def children(pid):
    """Children of every thread of pid (a Go program forks from any of them)."""
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/children") as f:
                out += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return out


def rank_of(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for kv in f.read().split(b"\0"):
                if kv.startswith(b"GOCOLL_RANK="):
                    return int(kv.split(b"=", 1)[1])
    except (OSError, ValueError):
        pass
    return None


def kb_fields(path):
    out = {}
    with open(path) as f:
        for line in f:
            m = re.match(r"(\w+):\s+(\d+) kB", line)
            if m:
                out[m.group(1)] = int(m.group(2)) * 1024
    return out


SEG = re.compile(r"memfd:gocoll-(arena-)?([0-9a-f]{16})-(\d+)")


def segments(pid, rank):
    """Per kind (shm, arena) and owner (own, peers): mappings, bytes mapped, bytes resident."""
    out = {}
    cur = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                m = SEG.search(line)
                cur = None
                if m:
                    kind = "arena" if m.group(1) else "shm"
                    who = "own" if int(m.group(3)) == rank else "peers"
                    cur = out.setdefault(f"{kind}_{who}", {"maps": 0, "size": 0, "rss": 0})
                    cur["maps"] += 1
                continue
            if cur is not None:
                m = re.match(r"(Size|Rss):\s+(\d+) kB", line)
                if m:
                    cur[m.group(1).lower()] += int(m.group(2)) * 1024
    return out


def sample(pid, rank, detail):
    s = {"fds": len(os.listdir(f"/proc/{pid}/fd"))}
    with open(f"/proc/{pid}/maps") as f:
        lines = f.readlines()
    s["maps"] = len(lines)
    s["gocoll_maps"] = sum(1 for l in lines if "memfd:gocoll" in l)
    st = kb_fields(f"/proc/{pid}/status")
    s["rss"], s["rss_shmem"], s["rss_anon"] = st.get("VmRSS", 0), st.get("RssShmem", 0), st.get("RssAnon", 0)
    s["vm_size"] = st.get("VmSize", 0)
    s["pss"] = kb_fields(f"/proc/{pid}/smaps_rollup").get("Pss", 0)
    if detail:
        s["segments"] = segments(pid, rank)
    return s


def merge_max(a, b):
    for k, v in b.items():
        if isinstance(v, dict):
            merge_max(a.setdefault(k, {}), v)
        else:
            a[k] = max(a.get(k, 0), v)


STAMP = re.compile(r"time=(\S+) level=\w+ msg=(\"[^\"]*\"|\S+).*?rank=(\d+)")


def log_times(path, t0):
    """Seconds after launch at which each setup message came: the first
    rank's and the last rank's."""
    first, last = {}, {}
    with open(path, errors="replace") as f:
        for line in f:
            m = STAMP.search(line)
            if not m:
                continue
            msg = m.group(2).strip('"')
            if msg not in ("bootstrap: rank joined", "shm: segment created", "shmcoll: segment created",
                           "shm: connected", "shmcoll: connected", "connected"):
                continue
            t = datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()
            last[msg] = max(last.get(msg, 0), t - t0)
            first[msg] = min(first.get(msg, 1e9), t - t0)
    return {k: [round(first[k], 3), round(v, 3)] for k, v in last.items()}


def main():
    bench, n, flags = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    shm_before = set(os.listdir("/dev/shm"))
    load = os.getloadavg()
    base = meminfo()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = dict(os.environ, GOCOLL_DEBUG="DEBUG")
    logf = tempfile.NamedTemporaryFile(prefix="shmscale-", suffix=".log", delete=False)
    t0 = time.time()
    p = subprocess.Popen([bench, "-procs", str(n), *flags], stdout=subprocess.PIPE, stderr=logf, env=env)
    per, ranks, peak = {}, {}, {"shmem": 0, "pagetables": 0}
    detail_ranks = {0, n // 2, n - 1}
    while p.poll() is None:
        for pid in children(p.pid):
            if pid not in ranks:
                ranks[pid] = rank_of(pid)
            rank = ranks[pid]
            if rank is None:
                continue
            try:
                merge_max(per.setdefault(rank, {}), sample(pid, rank, rank in detail_ranks))
            except (OSError, ValueError):
                pass  # exited meanwhile
        mi = meminfo()
        peak["shmem"] = max(peak["shmem"], mi["Shmem"] - base["Shmem"])
        peak["pagetables"] = max(peak["pagetables"], mi["PageTables"] - base["PageTables"])
        time.sleep(0.1)
    out = p.stdout.read().decode(errors="replace")
    rc = p.wait()
    logf.close()
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    time.sleep(0.5)
    after = meminfo()
    left = sorted(set(os.listdir("/dev/shm")) - shm_before)

    def stat(key):
        vals = sorted(v[key] for v in per.values() if key in v)
        return {"max": vals[-1], "median": vals[len(vals) // 2]} if vals else None

    res = {
        "n": n, "flags": flags, "rc": rc, "load_before": [round(x, 1) for x in load],
        "ranks_sampled": len(per),
        "fds": stat("fds"), "maps": stat("maps"), "gocoll_maps": stat("gocoll_maps"),
        "rss": stat("rss"), "rss_shmem": stat("rss_shmem"), "rss_anon": stat("rss_anon"),
        "pss": stat("pss"), "vm_size": stat("vm_size"),
        "segments": {r: per[r].get("segments") for r in sorted(detail_ranks) if r in per},
        "host_shmem_peak": peak["shmem"], "host_pagetables_peak": peak["pagetables"],
        "host_shmem_after": after["Shmem"] - base["Shmem"],
        "dev_shm_left": left,
        "cpu_s": round(ru.ru_utime - ru0.ru_utime + ru.ru_stime - ru0.ru_stime, 2),
        "minflt": ru.ru_minflt - ru0.ru_minflt,
        "wall_s": round(time.time() - t0, 2),
        "setup_s": log_times(logf.name, t0),
        "log": logf.name,
        "wrong": re.findall(r"Out of bounds values : (\d+)", out),
    }
    if rc != 0:
        res["stdout_tail"] = out[-2000:]
    print(json.dumps(res))


if __name__ == "__main__":
    main()
