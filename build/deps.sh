#!/bin/sh
# Installs what gocoll's demo and tests need from Debian: a C toolchain and
# pkg-config (cgo, C tests), Open MPI (launcher tests, benchmarks), Python with
# torch, numpy, pytest, venv and the wheel tools (the Python bridge and its offline install), hwloc's library
# (topology detection through it, tested against /sys), and Fashion-MNIST (the demo).
# As root it runs apt-get; otherwise it prints the command to run as root.
# base is the few that the steps of build/test.sh before go-test need (cgo,
# and ip for the engine's network-namespace tests), so that test.sh can
# install the rest while those steps run.
# Usage: build/deps.sh [demo|test|base]
set -eu
base="gcc pkg-config iproute2"
case "${1:-test}" in
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
