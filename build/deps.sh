#!/bin/sh
# Installs what gocoll's demo and tests need from Debian: a C toolchain and
# pkg-config (cgo, C tests), Open MPI (launcher tests, benchmarks), Python with
# torch, numpy, pytest, venv and the wheel tools (the Python bridge and its offline install), hwloc's library
# (topology detection through it, tested against /sys), and Fashion-MNIST (the demo).
# As root it runs apt-get; otherwise it prints the command to run as root.
# base is the few that the steps of build/test.sh before go-test need (cgo,
# and ip for the engine's network-namespace tests), so that test.sh can
# install the rest while those steps run, and debootstrap, so that the
# Debian 13 tree made beside that install needs no apt-get of its own (two
# at once would contend for dpkg's lock).
# trixie makes (or reuses) a Debian 13 tree with torch 2.6 on Python 3.13,
# numpy 2, pytest and Open MPI 5, where build/test.sh runs the Python
# bridge's torch 2.x tests (bridge/python/tools/in_tree.sh enters it).
# Usage: build/deps.sh [demo|test|base]
#        build/deps.sh trixie [DIR]   (default $GOCOLL_TRIXIE_DIR, else /var/cache/gocoll/debian13)
set -eu
base="gcc pkg-config iproute2 debootstrap"

# The Debian 13 tree. A tree is complete when its stamp names the suite and
# packages asked for now: then it is reused as it is. Otherwise it is made
# from nothing beside DIR and moved into place only once it works, so an
# interrupted run leaves nothing that a later run could take for complete.
trixie_tree() {
	dir=$1
	pkgs="python3,python3-torch,python3-numpy,python3-pytest,openmpi-bin"
	mirror=${GOCOLL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
	stamp="trixie $pkgs"
	if [ -f "$dir/.gocoll-tree" ] && [ "$(cat "$dir/.gocoll-tree")" = "$stamp" ]; then
		echo "deps: Debian 13 tree $dir is complete" >&2
		return 0
	fi
	if [ "$(id -u)" != 0 ]; then
		echo "deps: making the Debian 13 tree $dir needs root (debootstrap, chroot)" >&2
		return 1
	fi
	if ! command -v debootstrap >/dev/null; then
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq >/dev/null
		apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
	fi
	if [ -d "$dir" ] && [ ! -f "$dir/.gocoll-tree" ] && [ -n "$(ls -A "$dir")" ]; then
		echo "deps: $dir is not a tree made by build/deps.sh (no .gocoll-tree); choose another DIR" >&2
		return 1
	fi
	part=$dir.part
	for d in "$part" "$dir"; do
		[ -e "$d" ] || continue
		# debootstrap mounts /proc and /sys inside the tree; one killed
		# half-way leaves them there.
		grep -o " $d/[^ ]*" /proc/mounts | sort -r | while read -r m; do umount -l "$m"; done
		rm -rf --one-file-system "$d"
	done
	mkdir -p "$(dirname "$dir")"
	echo "deps: making a Debian 13 tree in $dir (debootstrap, about 1.5 GB)" >&2
	debootstrap --variant=minbase --include="$pkgs" trixie "$part" "$mirror" >"$part.log" 2>&1 || {
		tail -20 "$part.log" >&2
		echo "deps: debootstrap failed (log $part.log)" >&2
		return 1
	}
	rm -f "$part.log" "$part"/var/cache/apt/archives/*.deb
	chroot "$part" python3 -c 'import numpy, pytest, torch.distributed' >/dev/null 2>&1 || {
		echo "deps: the Debian 13 tree cannot import torch" >&2
		return 1
	}
	echo "$stamp" >"$part/.gocoll-tree"
	mv "$part" "$dir"
}

case "${1:-test}" in
trixie)
	trixie_tree "${2:-${GOCOLL_TRIXIE_DIR:-/var/cache/gocoll/debian13}}"
	exit
	;;
base) want="$base" ;;
demo) want="gcc pkg-config dataset-fashion-mnist" ;;
*) want="$base dataset-fashion-mnist openmpi-bin libopenmpi-dev python3-torch python3-numpy python3-pytest python3-pip python3-wheel python3-setuptools python3-venv libhwloc15" ;;
esac
missing=""
for p in $want; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ]; then
	echo "deps: missing Debian packages:$missing" >&2
	echo "deps: run as root: apt-get update && apt-get install -y$missing" >&2
	exit 1
fi
echo "deps: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing >/dev/null
