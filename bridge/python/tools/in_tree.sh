#!/bin/sh
# Runs a command inside a Debian tree (build/deps.sh trixie makes one with
# torch 2.6 on Python 3.13), with this checkout, and TMPDIR when set, at the
# same paths inside, so that paths passed in (GOCOLL_LIBRARY, --basetemp)
# mean the same on both sides; the environment passes through, PATH aside.
# The mounts live in a mount namespace of the command's own (unshare), so
# nothing stays mounted when it ends, however it ends. Needs root.
# Usage: bridge/python/tools/in_tree.sh TREE command [args...]
set -eu
[ $# -ge 2 ] || { echo "usage: $0 TREE command [args...]" >&2; exit 2; }
tree=$(cd "$1" && pwd)
shift
[ -x "$tree/usr/bin/python3" ] || {
	echo "in_tree: $tree is not a Debian tree with python3 (build/deps.sh trixie DIR makes one)" >&2
	exit 2
}
repo=$(cd "$(dirname "$0")/../../.." && pwd)
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
exec unshare --mount --propagation private sh -euc '
	t=$1 repo=$2 tmpdir=$3
	shift 3
	mount -t proc proc "$t/proc"
	mount --rbind /sys "$t/sys"
	mount --bind /dev "$t/dev"
	mount --bind /dev/shm "$t/dev/shm"
	[ ! -d /dev/pts ] || mount --bind /dev/pts "$t/dev/pts"
	mount --bind /etc/hosts "$t/etc/hosts"
	made=""
	for d in "$repo" "$tmpdir"; do
		[ -n "$d" ] || continue
		[ -d "$t$d" ] || { mkdir -p "$t$d"; made="$t$d $made"; }
		mount --bind "$d" "$t$d"
	done
	rc=0
	chroot "$t" sh -c "cd \"\$0\" && exec \"\$@\"" "$repo" "$@" || rc=$?
	# the mount points made for this run (the temp dir is new every run)
	for d in $made; do umount "$d" && rmdir "$d" 2>/dev/null || true; done
	exit $rc
' sh "$tree" "$repo" "${TMPDIR:-}" "$@"
