#!/usr/bin/python3
"""compare_report.py OUTDIR -- the report of build/compare.

Reads OUTDIR/raw.csv (rows of gocoll_bench.c, built for gocoll and for Open MPI, and of gloo_bench.py:
label,op,np,bytes,iters,med_us,min_us,p90_us,b2b_us,algbw_GBps,busbw_GBps,check[,p99_us,b2b_p50_us,b2b_p99_us]
with label "<lib>#<round>"; gloo_bench.py has no tail columns), OUTDIR/corelat.csv (lib,np,round,ns
before,ns after: the cross-core round trip around each step), OUTDIR/logs/memcpy-r*.md and xcopy-r*.md (memcpy_bw and xcopy tables),
OUTDIR/meta.txt and OUTDIR/notes.txt, and writes
  OUTDIR/results.md     per cross-core regime (see REGIMES): medians over the rounds run in it, ratios
                        gocoll/OpenMPI (plain and MemAlloc buffers) and gocoll/Gloo, and the performance
                        goals (Targets) checked against them
  OUTDIR/plotdata.json  busbw against size per library, one panel per op x np
build/compare draws OUTDIR/results.png from plotdata.json with build/bench/compareplot
(gonum.org/v1/plot): the one plotting path of the repository is Go.
"""
import csv
import glob
import json
import os
import re
import statistics
import sys
from collections import defaultdict

OPNAME = {"bcast": "broadcast"}
OP_ORDER = ["allreduce", "allgather", "broadcast", "alltoall", "alltoallv", "reduce_scatter"]
LIBS = ["gocoll", "gocoll-base", "gocoll-memalloc", "gloo", "openmpi"]
# (library, op) pairs its bench script cannot run: build/compare does not
# ask for them, so they are not missing.
NO_BENCH = {("gloo", "alltoallv"): "../shared/bench/gloo_bench.py has no alltoallv"}
LIBNAME = {"gocoll": "gocoll", "gocoll-base": "gocoll (base)", "gocoll-memalloc": "gocoll (MemAlloc)", "gloo": "Gloo", "openmpi": "Open MPI"}
FACTOR = {"allreduce": "2(n-1)/n", "allgather": "(n-1)/n", "reduce_scatter": "(n-1)/n", "alltoall": "(n-1)/n",
          "alltoallv": "(n-1)/n", "broadcast": "1"}
SIZE_MEANING = {"allreduce": "buffer bytes", "broadcast": "buffer bytes", "allgather": "gathered output bytes",
                "reduce_scatter": "input bytes", "alltoall": "per-rank send buffer bytes",
                "alltoallv": "per-rank send buffer bytes, equal counts through the v interface (as OSU's osu_alltoallv); "
                             "Gloo's bench has no alltoallv"}


def human(b):
    b = int(b)
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div and b % div == 0:
            return "%d %s" % (b // div, unit)
    return "%d B" % b


def med(v):
    return statistics.median(v) if v else None


# The VM's two vCPUs sit on host cores that share a cache or not, and this
# changes during a run: a 2-rank 1 MiB allreduce took several times longer
# in the second case (Open MPI's less so), so a median over rounds that
# mixes the two compares nothing. A step whose cross-core round trip
# (build/bench/corelat) was below NEAR_NS before and after it ran "near",
# one at or above it both times "far"; the report is written per regime,
# and a step whose regime changed while it ran counts in neither.
NEAR_NS = 250
REGIMES = [("near", "cores sharing a cache (cross-core round trip < %d ns)" % NEAR_NS),
           ("far", "cores not sharing a cache (cross-core round trip ≥ %d ns)" % NEAR_NS)]


def load_regimes(out):
    """(lib, np, round) -> "near", "far" or "mixed", from corelat.csv."""
    reg = {}
    path = os.path.join(out, "corelat.csv")
    if not os.path.exists(path):
        return reg
    with open(path) as f:
        for r in csv.reader(f):
            try:
                lib, np_, rnd, ns = r[0], int(r[1]), r[2], [float(x) for x in r[3:5]]
            except (ValueError, IndexError):
                continue  # corelat did not run: no regime
            if max(ns) < NEAR_NS:
                reg[(lib, np_, rnd)] = "near"
            elif min(ns) >= NEAR_NS:
                reg[(lib, np_, rnd)] = "far"
            else:
                reg[(lib, np_, rnd)] = "mixed"
    return reg


def new_cells():
    return defaultdict(lambda: {"med": [], "busbw": [], "b2b": [], "p99": [], "b2b_p50": [], "b2b_p99": [],
                                "rounds": [], "regime": [], "ok": []})


def failed(c):
    """How many of the cell's rows failed their correctness check."""
    return c["ok"].count(False)


def in_regime(cells, regime):
    """The rows of cells measured in regime."""
    sub = new_cells()
    for k, c in cells.items():
        for i, rg in enumerate(c["regime"]):
            if rg != regime:
                continue
            d = sub[k]
            for key in ("med", "busbw", "b2b", "rounds", "regime", "ok"):
                d[key].append(c[key][i])
            for key in ("p99", "b2b_p50", "b2b_p99"):
                if len(c[key]) == len(c["med"]):
                    d[key].append(c[key][i])
    return sub


def load(out, regimes):
    cells = new_cells()
    unsupported = set()
    with open(os.path.join(out, "raw.csv")) as f:
        for r in csv.reader(f):
            if len(r) < 12 or r[0].startswith("#"):
                continue
            lib, _, rnd = r[0].partition("#")
            op, np_ = OPNAME.get(r[1], r[1]), int(r[2])
            if r[11] == "UNSUPPORTED":
                unsupported.add((lib, op, np_))
                continue
            c = cells[(lib, op, np_, int(r[3]))]
            c["med"].append(float(r[5]))
            c["busbw"].append(float(r[10]))
            c["b2b"].append(float(r[8]))
            for key, col in (("p99", 12), ("b2b_p50", 13), ("b2b_p99", 14)):
                if len(r) > col and r[col]:
                    c[key].append(float(r[col]))
            c["rounds"].append(rnd)
            c["regime"].append(regimes.get((lib, np_, rnd)))
            c["ok"].append(r[11] == "ok")
    return cells, unsupported


def load_memcpy(out):
    """memcpy_bw's and xcopy's tables over the rounds, merged by buffer size:
    (columns, bytes -> column -> values)."""
    rows = defaultdict(lambda: defaultdict(list))  # bytes -> column -> values
    header = []
    for pattern in ("memcpy-r*.md", "xcopy-r*.md"):
        cols = None
        for path in sorted(glob.glob(os.path.join(out, "logs", pattern))):
            with open(path) as f:
                for line in f:
                    if line.startswith("| bytes"):
                        cols = [h.strip() for h in line.strip().strip("|").split("|")][1:]
                        header += [h for h in cols if h not in header]
                        continue
                    m = re.match(r"^\| (\d+) \|(.*)\|\s*$", line)
                    if not m or cols is None:
                        continue
                    vals = [v.strip().split(" ")[0] for v in m.group(2).split("|")]
                    for h, v in zip(cols, vals):
                        try:
                            rows[int(m.group(1))][h].append(float(v))
                        except ValueError:
                            pass
    return header, rows


def load_percall(out):
    """(lib, op) -> the median over rounds of one rank's 4 KiB p50 (µs), from
    percall.csv: what a call costs with no peer to wait for."""
    vals = defaultdict(list)
    path = os.path.join(out, "percall.csv")
    if os.path.exists(path):
        with open(path) as f:
            for r in csv.reader(f):
                if len(r) < 12 or r[0].startswith("#") or r[11] != "ok":
                    continue
                vals[(r[0].partition("#")[0], OPNAME.get(r[1], r[1]))].append(float(r[5]))
    return {k: med(v) for k, v in vals.items()}


def read_kv(path):
    d = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                k, _, v = line.rstrip("\n").partition("=")
                d[k] = v
    return d


def ratio(a, b):
    if a is None or b is None or b <= 0:
        return "-"
    return "%.2f" % (a / b)


def fmt_cell(c):
    if c is None or not c["busbw"]:
        return "-"
    s = "%.3g (%s" % (med(c["busbw"]), fmt_us(med(c["med"])))
    s += " / %s)" % fmt_us(med(c["p99"])) if c["p99"] else ")"
    if failed(c):
        s += " **CHECK FAILED**"
    return s


def fmt_us(us):
    if us >= 10000:
        return "%.1f ms" % (us / 1000)
    if us >= 100:
        return "%.0f µs" % us
    return "%.1f µs" % us


def spread(c):
    if c is None or len(c["med"]) < 2:
        return "-"
    return "%.0f%%" % (100 * (max(c["med"]) / min(c["med"]) - 1))


def main():
    out = sys.argv[1]
    regimes = load_regimes(out)
    cells, unsupported = load(out, regimes)
    meta = read_kv(os.path.join(out, "meta.txt"))
    notes = open(os.path.join(out, "notes.txt")).read().strip() if os.path.exists(os.path.join(out, "notes.txt")) else ""
    nps = sorted({k[2] for k in cells} | {u[2] for u in unsupported})
    sizes = sorted({k[3] for k in cells})
    ops = [o for o in OP_ORDER if any(k[1] == o for k in cells)] + sorted({k[1] for k in cells} - set(OP_ORDER))
    libs = [l for l in LIBS if any(k[0] == l for k in cells) or any(u[0] == l for u in unsupported)]
    nproc = int(meta.get("nproc", "0") or 0)
    L = []
    w = L.append
    w("# gocoll vs Gloo vs Open MPI (build/compare, %s)" % meta.get("start", "?"))
    w("")
    w("Generated by `build/compare` (%s s of runs; %s of %s rounds, the libraries interleaved round by round, "
      "their order rotated each round). Raw rows: `raw.csv`; spread between rounds: `noise.md`; plot: `results.png`."
      % (meta.get("seconds_runs", "?"), meta.get("rounds_done", "?"), meta.get("rounds", "?")))
    w("")
    over = meta.get("oversubscribed", "")
    w("- Machine: %s%s, %s cores online, kernel %s. Load average (1/5/15 min) at start %s, at end %s%s." % (
        meta.get("cpu", "?"), " (%s)" % meta["cpu_id"] if meta.get("cpu_id") else "", meta.get("nproc", "?"), meta.get("kernel", "?"), meta.get("load_start", "?"),
        meta.get("load_end", "?"),
        " -- **the machine was loaded by other work when the run started (load above the core count): every "
        "library here shared the cores with other processes, so absolute numbers are low and noisy; the "
        "interleaved ratios are what to read**" if _loaded(meta, nproc) else ""))
    if over:
        w("- **np=%s oversubscribe the %s cores**: more ranks than cores, so those numbers include the scheduler "
          "(who yields, who spins) as much as the algorithms." % (over, meta.get("nproc", "?")))
    w("- gocoll %s (C ABI, `build/bench/gocoll_bench.c`, ranks started with torchrun-style variables, "
      "`gocollCommInitFromEnv`); Gloo via torch %s (`../shared/bench/gloo_bench.py`, TCP loopback, one thread per "
      "rank); Open MPI %s (`build/bench/gocoll_bench.c` built with `-DBENCH_MPI`: `../shared/bench/mpi_bench.c`'s method plus the tails, `mpirun --oversubscribe`, library defaults); %s." % (
          meta.get("git", "?"), meta.get("torch", "?"), meta.get("openmpi", "?"), meta.get("go", "")))
    if meta.get("base"):
        w("- gocoll (base): BASE=%s, built from a git worktree of that commit with its own `build/build.sh`, "
          "measured by the same `gocoll_bench.c` in the same rounds: the before of a before/after." % meta["base"])
    w("- Method (same for all): float32, sum; sizes %s; per (op, size) one exact-integer correctness check, "
      "warm-up (%s), then ~%s s of iterations each = (barrier; one op), iteration time = max over ranks; the "
      "table shows the median over iterations (p50), then the median of that over rounds. busbw = size/time x "
      "factor (nccl-tests: allreduce 2(n-1)/n; allgather, reduce_scatter, alltoall(v) (n-1)/n; broadcast 1)." % (
          meta.get("sizes", "?"), meta.get("iters", "?"), meta.get("t", "?")))
    if regimes:
        count = defaultdict(int)
        for rg in regimes.values():
            count[rg] += 1
        w("- Cross-core regime (`build/bench/corelat`, a cache line between two pinned threads, before and after "
          "every step): %d steps near, %d far, %d changed while they ran (left out). A VM's vCPUs can sit on host "
          "cores that share a cache or not, and this can change during a run; small and mid-size calls take "
          "several times longer in the second case, by different factors for different libraries. The results "
          "are therefore given per regime, each from the steps run in it."
          % (count["near"], count["far"], count["mixed"]))
    w("- Cells: busbw GB/s (p50 time / p99 time; p99 where the library's bench reports it: gocoll and Open MPI, "
      "with fewer than 100 iterations the maximum). Ratios: gocoll busbw / other busbw (> 1: gocoll faster), from the medians of the regime's steps. "
      "`gocoll (MemAlloc)`: the same C benchmark with buffers from `gocollMemAlloc`. spread: max/min - 1 of "
      "gocoll's p50 over rounds. The machine is noisy: differences under ~20% are not meaningful (see noise.md).")
    w("")

    header, mrows = load_memcpy(out)
    percall = load_percall(out)
    groups = [(rg, title, in_regime(cells, rg)) for rg, title in REGIMES]
    groups = [g for g in groups if g[2]]
    if not groups:  # no corelat.csv (or every step changed regime): all rows together
        groups = [(None, "every round", cells)]
    for rg, title, sub in groups:
        steps = sorted({(k[0], k[2], r) for k, c in sub.items() for r in c["rounds"]})
        w("## %s: %d steps" % (title[0].upper() + title[1:], len(steps)))
        w("")
        write_regime(w, sub, mrows, libs, ops, nps, sizes, unsupported, nproc, percall)
    pops = [op for op in ops if ("gocoll", op) in percall]
    if pops:
        w("## Per-call cost: one rank, 4 KiB, p50 µs (median over rounds)")
        w("")
        w("What a call costs with no peer to wait for: the C ABI, argument checks, bookkeeping and the copy of "
          "the rank's own block. Targets subtract the difference from a 4 KiB cell behind Open MPI.")
        w("")
        base = any(k[0] == "gocoll-base" for k in percall)
        w("| op | gocoll |%s Open MPI | difference |" % (" gocoll (base) |" if base else ""))
        w("|---|---:|%s---:|---:|" % ("---:|" if base else ""))
        for op in pops:
            g, o = percall[("gocoll", op)], percall.get(("openmpi", op))
            b = percall.get(("gocoll-base", op))
            w("| %s | %.2f |%s %s | %s |" % (op, g, (" %s |" % ("-" if b is None else "%.2f" % b)) if base else "",
                                            "-" if o is None else "%.2f" % o,
                                            "-" if o is None else "%+.2f" % (g - o)))
        w("")
    if mrows:
        w("## Machine limits: memcpy_bw (`../shared/bench/memcpy_bw.c`) and the cross-core copy-in rate "
          "(`build/bench/xcopy.c`: one core copies into lines the other read last), median over rounds, GB/s")
        w("")
        w("| bytes | " + " | ".join(header) + " |")
        w("|---:|" + "---:|" * len(header))
        for b in sorted(mrows):
            w("| %s | %s |" % (human(b), " | ".join(
                "%.2f" % med(mrows[b][h]) if mrows[b].get(h) else "-" for h in header)))
        w("")

    fails = [(k, c) for k, c in sorted(cells.items()) if failed(c)]
    w("## Problems seen")
    w("")
    if fails:
        for k, c in fails:
            w("- correctness check FAILED: %s %s np=%d %s (%d of %d rounds)" % (k[0], k[1], k[2], human(k[3]),
                                                                           failed(c), len(c["busbw"])))
    missing = []
    for l in libs:
        for op in ops:
            for np_ in nps:
                if (l, op, np_) in unsupported or (l, op) in NO_BENCH:
                    continue
                for s in sizes:
                    c = cells.get((l, op, np_, s))
                    n = len(c["busbw"]) if c else 0
                    if n < int(meta.get("rounds_done", "0") or 0):
                        missing.append("%s %s np=%d %s (%d rounds)" % (l, op, np_, human(s), n))
    if missing:
        w("- missing measurements (a launch failed or timed out): " + "; ".join(missing))
    for (l, op), why in sorted(NO_BENCH.items()):
        if l in libs and op in ops:
            w("- %s: not measured (%s)" % (LIBNAME.get(l, l), why))
    for l, op, np_ in sorted(unsupported):
        w("- %s does not support %s (np=%d): skipped" % (LIBNAME.get(l, l), op, np_))
    if notes:
        w(notes)
    if not fails and not missing and not notes:
        w("- every launch finished and every correctness check passed")
    w("")
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(L))

    # plot data: one panel per op x np, busbw (median over rounds) against
    # size per library, from the regime with the most steps
    rg, title, cells = max(groups, key=lambda g: sum(len(c["med"]) for c in g[2].values()))
    panels = []
    for op in ops:
        for np_ in nps:
            series = []
            for l in libs:
                pts = [[s, med(cells[(l, op, np_, s)]["busbw"])] for s in sizes if (l, op, np_, s) in cells]
                pts = [p for p in pts if p[1] and p[1] > 0]
                if pts:
                    series.append({"name": LIBNAME[l], "points": pts})
            panels.append({"title": "%s np=%d%s" % (op, np_, " (oversubscribed)" if nproc and np_ > nproc else ""),
                           "series": series})
    plot = {"title": "busbw (GB/s, median over rounds, %s) vs size -- build/compare %s" % (
                title.split(" (")[0], meta.get("start", "")),
            "cols": len(nps), "xlabel": "size (bytes)", "ylabel": "busbw GB/s", "panels": panels}
    with open(os.path.join(out, "plotdata.json"), "w") as f:
        json.dump(plot, f, indent=1)
    return 0


def write_regime(w, cells, mrows, libs, ops, nps, sizes, unsupported, nproc, percall):
    """Ratio tables, Targets and per-collective tables of the rows in cells."""
    # headline: ratios by op x np (columns: sizes)
    for mine, mname, other, oname in (("gocoll", "gocoll", "openmpi", "Open MPI"),
                                      ("gocoll-memalloc", "gocoll (MemAlloc)", "openmpi", "Open MPI"),
                                      ("gocoll", "gocoll", "gloo", "Gloo")):
        if other not in libs or mine not in libs:
            continue
        w("### %s / %s busbw ratio (> 1: gocoll faster)" % (mname, oname))
        w("")
        w("| op | np | " + " | ".join(human(s) for s in sizes) + " |")
        w("|---|---:|" + "---:|" * len(sizes))
        for op in ops:
            for np_ in nps:
                row = []
                for s in sizes:
                    g, o = cells.get((mine, op, np_, s)), cells.get((other, op, np_, s))
                    if (other, op, np_) in unsupported:
                        row.append("n/a")
                    else:
                        row.append(ratio(med(g["busbw"]) if g else None, med(o["busbw"]) if o else None))
                w("| %s | %d | %s |" % (op, np_, " | ".join(row)))
        w("")

    if "gocoll-base" in libs and "gocoll" in libs:
        write_base(w, cells, ops, nps, sizes)

    trows = targets(cells, mrows, percall)
    if trows:
        w("### Targets")
        w("")
        w("The performance goals gocoll is held to on this machine, checked against this run (medians over "
          "rounds; plain: `posix_memalign` buffers, MemAlloc: `gocollMemAlloc` buffers).")
        w("")
        w("| goal | measured (plain) | met | measured (MemAlloc) | met |")
        w("|---|---|:-:|---|:-:|")
        for row in trows:
            w("| " + " | ".join(row) + " |")
        w("")

    w("### Per collective: busbw GB/s (p50 / p99 time), medians over rounds")
    w("")
    for op in ops:
        w("#### %s (size = %s, busbw factor %s)" % (op, SIZE_MEANING.get(op, "bytes"), FACTOR.get(op, "?")))
        w("")
        for np_ in nps:
            w("**np=%d**%s" % (np_, " (oversubscribed)" if nproc and np_ > nproc else ""))
            w("")
            hdr = ["size"] + [LIBNAME[l] for l in libs] + ["gocoll/Open MPI", "gocoll/Gloo", "gocoll spread"]
            w("| " + " | ".join(hdr) + " |")
            w("|---:|" + "---:|" * (len(hdr) - 1))
            for s in sizes:
                row = [human(s)]
                for l in libs:
                    if (l, op, np_) in unsupported:
                        row.append("unsupported")
                    else:
                        row.append(fmt_cell(cells.get((l, op, np_, s))))
                g = cells.get(("gocoll", op, np_, s))
                gb = med(g["busbw"]) if g else None
                for other in ("openmpi", "gloo"):
                    o = cells.get((other, op, np_, s))
                    row.append("n/a" if (other, op, np_) in unsupported else ratio(gb, med(o["busbw"]) if o else None))
                row.append(spread(g))
                w("| " + " | ".join(row) + " |")
            w("")



# The tolerance of a before/after cell measured in one round only (no
# spread of its own): the machine's usual noise (see the header).
NOISE = 0.20


def slower_than_base(g, b):
    """Whether gocoll's cell g is slower than the base's b beyond the
    run-to-run spread: its median p50 above the base's by more than the
    larger of the two libraries' spreads over rounds (max/min - 1 of p50),
    or than NOISE where either was measured in one round only."""
    if len(g["med"]) < 2 or len(b["med"]) < 2:
        tol = NOISE
    else:
        tol = max(max(c["med"]) / min(c["med"]) - 1 for c in (g, b))
    return med(g["med"]) > med(b["med"]) * (1 + tol)


def write_base(w, cells, ops, nps, sizes):
    """Before/after: gocoll / gocoll-base busbw per cell, and the cells
    slower than the base beyond the spread of the rounds (marked **)."""
    w("### gocoll / gocoll (base) busbw ratio: after / before (> 1: faster now)")
    w("")
    w("`**`: slower than the base beyond the run-to-run spread (gocoll's median p50 above the base's by more than "
      "the larger of the two spreads over rounds; by more than %d%% where a cell has one round in this regime)."
      % (100 * NOISE))
    w("")
    w("| op | np | " + " | ".join(human(s) for s in sizes) + " |")
    w("|---|---:|" + "---:|" * len(sizes))
    flagged = []
    for op in ops:
        for np_ in nps:
            row = []
            for s in sizes:
                g, b = cells.get(("gocoll", op, np_, s)), cells.get(("gocoll-base", op, np_, s))
                if not g or not b or not g["busbw"] or not b["busbw"]:
                    row.append("-")
                    continue
                r = ratio(med(g["busbw"]), med(b["busbw"]))
                slow = slower_than_base(g, b)
                if slow:
                    flagged.append("%s np=%d %s %s×" % (op, np_, human(s), r))
                row.append(r + (" **" if slow else ""))
            w("| %s | %d | %s |" % (op, np_, " | ".join(row)))
    w("")
    w("Slower than the base beyond the spread: %s." % ("; ".join(flagged) if flagged else "none"))
    w("")


def targets(cells, mrows, percall=None):
    """Rows (goal, plain value, met, MemAlloc value, met) of issue 16's goals
    that the run has the cells for. A 4 KiB cell behind Open MPI also shows
    its ratio with gocoll's time less the difference of the two libraries'
    one-rank call (percall): what is left once the cost of a call alone is
    taken out."""
    percall = percall or {}
    def val(lib, op, np_, size, key="busbw"):
        c = cells.get((lib, op, np_, size))
        return med(c[key]) if c and c[key] else None

    def mark(ok):
        return "-" if ok is None else ("yes" if ok else "**no**")

    rows = []

    def ratio_row(goal, op, np_, size, want, libs=("gocoll", "gocoll-memalloc")):
        o = val("openmpi", op, np_, size)
        if o is None:
            return
        row = [goal]
        for lib in ("gocoll", "gocoll-memalloc"):
            g = val(lib, op, np_, size) if lib in libs else None
            r = g / o if g is not None and o > 0 else None
            row += ["-" if r is None else "%.2f×" % r, mark(None if r is None else r >= want)]
        rows.append(row)

    # No cell behind Open MPI, plain buffers.
    behind, seen = [], 0
    for (lib, op, n, size), c in sorted(cells.items()):
        o = val("openmpi", op, n, size)
        if lib == "gocoll" and o and c["busbw"]:
            seen += 1
            r = med(c["busbw"]) / o
            if r < 1:
                what = "%s np=%d %s %.2f×" % (op, n, human(size), r)
                pg, po = percall.get(("gocoll", op)), percall.get(("openmpi", op))
                g_us, o_us = val("gocoll", op, n, size, "med"), val("openmpi", op, n, size, "med")
                if size == 4 << 10 and None not in (pg, po, g_us, o_us) and g_us - (pg - po) > 0:
                    what += " (%.2f× less the per-call difference)" % (o_us / (g_us - (pg - po)))
                behind.append(what)
    if seen:
        rows.append(["no cell behind Open MPI (plain buffers, %d cells)" % seen, "; ".join(behind) or "none",
                     mark(not behind), "", ""])
    for np_ in (2, 4):
        for size in (64 << 10, 1 << 20, 16 << 20, 64 << 20):
            ratio_row("allreduce np=%d %s: plain busbw ≥ 1.5× Open MPI" % (np_, human(size)), "allreduce", np_, size,
                      1.5, libs=("gocoll",))
    for np_ in (2, 4):
        for size in (64 << 10, 1 << 20, 16 << 20, 64 << 20):
            ratio_row("allreduce np=%d %s: MemAlloc busbw ≥ 2× Open MPI" % (np_, human(size)), "allreduce", np_,
                      size, 2.0, libs=("gocoll-memalloc",))
    # The floor of a plain-buffer allreduce: a MemAlloc allreduce plus copying
    # this rank's share (size/np) in at the measured cross-core copy rate
    # (xcopy's; memcpy_bw's single-core rate, higher, where xcopy did not run).
    for np_ in (2, 4):
        for size in (64 << 10, 1 << 20, 16 << 20, 64 << 20):
            g, gm = val("gocoll", "allreduce", np_, size, "med"), val("gocoll-memalloc", "allreduce", np_, size, "med")
            rate, how = copy_rate(mrows, size)
            if g is None or gm is None or not rate:
                continue
            floor = gm + (size / np_) / (rate * 1e3)  # µs: bytes / (GB/s · 1e3)
            rows.append(["allreduce np=%d %s: plain / floor ≤ 1.15 (floor %s = MemAlloc %s + copy-in at %.1f GB/s, %s)"
                         % (np_, human(size), fmt_us(floor), fmt_us(gm), rate, how),
                         "%.2f" % (g / floor), mark(g / floor <= 1.15), "", ""])
    # Small messages: p50 and p99, after a barrier and back to back.
    for np_, want in ((2, 1.0), (4, 0.5)):
        for phase, p50, p99 in (("after a barrier", "med", "p99"), ("back to back", "b2b_p50", "b2b_p99")):
            o50, o99 = val("openmpi", "allreduce", np_, 4 << 10, p50), val("openmpi", "allreduce", np_, 4 << 10, p99)
            if o50 is None:
                continue
            row = ["allreduce np=%d 4 KiB %s: p50 ≤ %sOpen MPI's (%s)%s" % (
                np_, phase, "" if want == 1 else "%.1f× " % want, fmt_us(o50),
                "" if o99 is None else ", p99 ≤ Open MPI's (%s)" % fmt_us(o99))]
            for lib in ("gocoll", "gocoll-memalloc"):
                g50, g99 = val(lib, "allreduce", np_, 4 << 10, p50), val(lib, "allreduce", np_, 4 << 10, p99)
                if g50 is None:
                    row += ["-", "-"]
                    continue
                ok = g50 <= want * o50 and (o99 is None or g99 is None or g99 <= o99)
                row += ["p50 %s%s" % (fmt_us(g50), "" if g99 is None else ", p99 %s" % fmt_us(g99)), mark(ok)]
            rows.append(row)
    for np_ in (2, 4):
        rs = []
        for (lib, op, n, size), c in cells.items():
            if lib == "gocoll" and op == "allreduce" and n == np_:
                gl = val("gloo", op, n, size)
                if gl and c["busbw"]:
                    rs.append(med(c["busbw"]) / gl)
        if rs:
            rows.append(["allreduce np=%d: busbw ≥ 3× Gloo at every size" % np_, "min %.1f×" % min(rs),
                         mark(min(rs) >= 3), "", ""])
    slower = []
    for (lib, op, n, size), c in cells.items():
        gl = val("gloo", op, n, size)
        if lib == "gocoll" and gl and c["busbw"] and med(c["busbw"]) < gl:
            slower.append("%s np=%d %s" % (op, n, human(size)))
    if any(k[0] == "gloo" for k in cells):
        rows.append(["no cell slower than Gloo", "; ".join(sorted(slower)) or "none", mark(not slower), "", ""])
    return rows


def copy_rate(mrows, size):
    """The copy-in rate (GB/s) at the measured size nearest to size, and what
    it is: xcopy's cross-core rate, else memcpy_bw's single-core one; (None,
    None) without either."""
    if not mrows:
        return None, None
    b = min(mrows, key=lambda m: abs(m - size))
    for col, how in (("xcopy GB/s", "cross-core"), ("memcpy 1T GB/s", "single-core memcpy")):
        v = mrows[b].get(col)
        if v:
            return med(v), how
    return None, None


def _loaded(meta, nproc):
    try:
        # at the start: the load of other work (at the end it includes our own ranks)
        return nproc and float(meta.get("load_start", "0").split()[0]) > nproc
    except (ValueError, IndexError):
        return False


if __name__ == "__main__":
    sys.exit(main())
