#!/bin/bash
# build/bench/callcost.sh -- the per-call cost of gocoll, before and after:
# one rank, 4 KiB, float32, through the C ABI (build/bench/callcost.c).
#
# Usage: BASE=<commit> build/bench/callcost.sh [outdir]   (default outdir: build/out/callcost)
#
# Builds libgocoll from this tree and from BASE (a git worktree under
# <outdir>/base-src), then:
#   instructions  callgrind (GODEBUG=asyncpreemptoff=1), counting only inside
#                 the C wrapper called (--toggle-collect: gocollAllReduce,
#                 ...), in a process whose only busy thread is the caller
#                 (callgrind's toggle counts every thread while on: a Go
#                 test binary has busy goroutines beside the benchmark, so
#                 its counts vary from run to run); runs of
#                 N1 and N2 calls after a warm-up, per call = the difference
#                 / (N2 - N1), so start-up and warm-up cancel out. Load on
#                 the machine does not change these counts.
#   time          ns per call through the C ABI, median of R batches of N
#                 calls, the two libraries run alternately (PAIRS times
#                 each; the table shows the median over pairs).
# Output: <outdir>/callcost.md (the table) and callcost.csv.
# Knobs: N1=1000 N2=6000 N=20000 R=11 PAIRS=9 OPS="allreduce bcast allgather
#   reduce_scatter alltoall alltoallv".
set -eu

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-$ROOT/build/out/callcost}
BASE=${BASE:?set BASE=<commit> (the before)}
N1=${N1:-1000}
N2=${N2:-6000}
N=${N:-20000}
R=${R:-11}
PAIRS=${PAIRS:-9}
OPS=${OPS:-"allreduce bcast allgather reduce_scatter alltoall alltoallv"}
CC=${CC:-cc}
command -v valgrind > /dev/null || { echo "callcost.sh: valgrind not found (apt-get install valgrind)" >&2; exit 2; }

LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SRC=$OUT/base-src
. "$ROOT/build/lib/base.sh"
base_checkout "$ROOT" "$BASE" "$SRC" "$OUT/worktree.log" || {
	echo "callcost.sh: BASE=$BASE: no checkout:" >&2; tail -5 "$OUT/worktree.log" >&2; exit 2; }
trap 'base_remove "$ROOT" "$SRC"' EXIT

# build TAG TREE: libgocoll and callcost of TREE.
build() {
	local tag=$1 tree=$2
	"$tree/build/build.sh" "$OUT/$tag" > "$OUT/build-$tag.log" 2>&1
	# this tree's callcost.c for both: one measuring program
	$CC -O2 -Wall -o "$OUT/callcost-$tag" "$ROOT/build/bench/callcost.c" -I"$OUT/$tag/include" \
		-L"$OUT/$tag/lib" -Wl,-rpath,"$OUT/$tag/lib" -lgocoll
}
build base "$SRC"
build new "$ROOT"

declare -A CFN=([allreduce]=gocollAllReduce [bcast]=gocollBroadcast [allgather]=gocollAllGather
	[reduce_scatter]=gocollReduceScatter [alltoall]=gocollAllToAll [alltoallv]=gocollAllToAllv)
# collected FN CMD...: callgrind's instruction count inside FN.
collected() {
	local fn=$1; shift
	GODEBUG=asyncpreemptoff=1 valgrind --tool=callgrind --toggle-collect="$fn" --callgrind-out-file=/dev/null "$@" 2>&1 |
		sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}

percall_c() { # tag op
	local a b
	a=$(collected "${CFN[$2]}" "$OUT/callcost-$1" -i "$N1" "$2")
	b=$(collected "${CFN[$2]}" "$OUT/callcost-$1" -i "$N2" "$2")
	echo $(( (b - a) / (N2 - N1) ))
}

echo "op,instr_base,instr_new,ns_base,ns_new" > "$OUT/callcost.csv"
declare -A NS
for p in $(seq 1 "$PAIRS"); do
	for tag in base new; do
		while read -r op ns; do NS[$tag,$op]="${NS[$tag,$op]:-} $ns"; done < <("$OUT/callcost-$tag" -t "$N" -r "$R" $OPS)
	done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
for op in $OPS; do
	cb=$(percall_c base "$op"); cn=$(percall_c new "$op")
	echo "$op,$cb,$cn,$(echo "${NS[base,$op]}" | median),$(echo "${NS[new,$op]}" | median)" >> "$OUT/callcost.csv"
done

{
	echo "# Per-call cost: one rank, 4 KiB (build/bench/callcost.sh)"
	echo
	echo "before: $BASE (${BASE_SHA:0:12}); after: $(cd "$ROOT" && git describe --always --dirty);" \
		"load at the start: $LOAD0;" \
		"CPU: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores online); load at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
	echo
	echo "| op | instructions before | after | change | ns before | after |"
	echo "|---|---:|---:|---:|---:|---:|"
	tail -n +2 "$OUT/callcost.csv" | awk -F, '{printf "| %s | %s | %s | %+.0f %% | %.0f | %.0f |\n", $1, $2, $3, 100 * ($3 / $2 - 1), $4, $5}'
} > "$OUT/callcost.md"
cat "$OUT/callcost.md"
