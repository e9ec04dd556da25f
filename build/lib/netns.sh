# build/lib/netns.sh -- emulated hosts for the benchmarks (sourced by
# build/hosts and build/redistbench; ../shared/DESIGN.md's recipe).
#
# Each emulated host is a network namespace with its own veth on a bridge
# (in a "switch" namespace of its own), its link limited with tc tbf to
# RATE in both directions (RATE=unlimited or 0: no tc at all, the veth
# carries what the CPUs can push); a process started with on_host runs under
# `unshare --mount --uts` with the host's name and the host's own tmpfs on
# /dev/shm, so processes of one host share memory and hosts share only TCP.
# The caller sets RATE and TMO (seconds per process) and calls netns_init
# first; namespaces, mounts and processes go on exit or Ctrl-C.

# netns_init: work directory, names, and the cleanup on exit.
netns_init() {
	TAG=$$
	SW=gcsw$TAG
	WORK=$(mktemp -d /tmp/gocoll-hosts.XXXXXX)
	HOSTS_UP=0
	trap netns_cleanup EXIT
	trap 'exit 130' INT TERM
}

netns_cleanup() {
	for pg in $(cat "$WORK/pgids" 2>/dev/null); do kill -KILL -- -"$pg" 2>/dev/null; done
	hosts_down
	rm -rf "$WORK"
}

# netns_check NAME: exit 0 with a note when this machine cannot emulate hosts.
netns_check() {
	if [ "$(id -u)" != 0 ]; then
		echo "$1: needs root (network namespaces, tc, mounts); skipped" >&2
		exit 0
	fi
	for tool in ip tc unshare timeout; do
		command -v $tool >/dev/null || { echo "$1: needs $tool; skipped" >&2; exit 0; }
	done
}

# link_unlimited: whether RATE asks for links without tc.
link_unlimited() { [ "$RATE" = unlimited ] || [ "$RATE" = 0 ]; }

addr() { echo 198.18.0.$(($1 + 1)); }

# hosts_up H: H namespaced hosts on a bridge, links limited to RATE
# (unless link_unlimited).
hosts_up() {
	local n=$1 h
	ip netns add $SW && ip -n $SW link add br0 type bridge && ip -n $SW link set br0 up || return 1
	ip -n $SW link set lo up
	for h in $(seq 0 $((n - 1))); do
		local ns=gch$h$TAG
		ip netns add $ns || return 1
		HOSTS_UP=$((h + 1))
		ip link add v$h$TAG type veth peer name b$h$TAG || return 1
		ip link set v$h$TAG netns $ns name v$h
		ip link set b$h$TAG netns $SW name b$h
		ip -n $SW link set b$h master br0
		ip -n $SW link set b$h up
		ip -n $ns addr add "$(addr $h)/24" dev v$h
		ip -n $ns link set v$h up
		ip -n $ns link set lo up
		if ! link_unlimited; then
			ip netns exec $ns tc qdisc add dev v$h root tbf rate $RATE burst 256kbit latency 100ms || return 1
			ip netns exec $SW tc qdisc add dev b$h root tbf rate $RATE burst 256kbit latency 100ms || return 1
		fi
		mkdir -p "$WORK/shm$h" && mount -t tmpfs -o size=1g tmpfs "$WORK/shm$h" || return 1
	done
}

hosts_down() {
	local h
	for h in $(seq 0 $((HOSTS_UP - 1))); do
		ip netns del gch$h$TAG 2>/dev/null
		umount "$WORK/shm$h" 2>/dev/null
	done
	ip netns del $SW 2>/dev/null
	HOSTS_UP=0
}

# on_host H CMD...: start CMD as a process of emulated host H in the
# background, in its own process group, under timeout; its pid is left in
# LASTPID (so the caller can wait for it).
on_host() {
	local h=$1
	shift
	setsid timeout -k 5 "$TMO" ip netns exec gch$h$TAG unshare --mount --uts \
		sh -c 'hostname "$0" && mount --bind "$1" /dev/shm && shift && exec "$@"' \
		gch$h "$WORK/shm$h" "$@" &
	LASTPID=$!
	echo $LASTPID >>"$WORK/pgids"
}
