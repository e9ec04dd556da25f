#!/bin/sh
# Builds libgocoll: the shared library, its public header and a pkg-config
# file, laid out as an install prefix:
#
#   <outdir>/lib/libgocoll.so.X.Y.Z      SONAME libgocoll.so.X
#   <outdir>/lib/libgocoll.so.X        -> libgocoll.so.X.Y.Z
#   <outdir>/lib/libgocoll.so          -> libgocoll.so.X
#   <outdir>/include/gocoll.h            the hand-written header (capi/gocoll.h)
#   <outdir>/lib/pkgconfig/gocoll.pc     relocatable (paths relative to itself)
#
# Usage: build/build.sh [outdir]     (default: build/out)
# Then:  PKG_CONFIG_PATH=<outdir>/lib/pkgconfig cc app.c $(pkg-config --cflags --libs gocoll)
#        and LD_LIBRARY_PATH=<outdir>/lib (or -Wl,-rpath,<outdir>/lib) to run.
# Needs Go and a C compiler (cgo). GO overrides the go command; GOFLAGS and
# CC are honoured as usual.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-"$root/build/out"}
GO=${GO:-go}

# The version lives in the header (GOCOLL_MAJOR/MINOR/PATCH).
ver() { sed -n "s/^#define GOCOLL_$1 \([0-9][0-9]*\)\$/\1/p" "$root/capi/gocoll.h"; }
major=$(ver MAJOR)
minor=$(ver MINOR)
patch=$(ver PATCH)
if [ -z "$major" ] || [ -z "$minor" ] || [ -z "$patch" ]; then
	echo "build.sh: cannot read GOCOLL_MAJOR/MINOR/PATCH from capi/gocoll.h" >&2
	exit 1
fi
version=$major.$minor.$patch
soname=libgocoll.so.$major
real=libgocoll.so.$version

mkdir -p "$out/lib/pkgconfig" "$out/include"
out=$(cd "$out" && pwd)
tmp=$(mktemp -d "$out/lib/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# The version script keeps every symbol but the gocoll* API local; the
# SONAME carries the major version.
cd "$root"
CGO_ENABLED=1 "$GO" build -buildmode=c-shared -buildvcs=false -trimpath \
	-ldflags "-extldflags '-Wl,-soname,$soname -Wl,--version-script=$root/build/libgocoll.map'" \
	-o "$tmp/$real" ./capi

# Replace atomically so that a running program never sees a half-written file.
mv -f "$tmp/$real" "$out/lib/$real"
ln -sfn "$real" "$out/lib/$soname"
ln -sfn "$soname" "$out/lib/libgocoll.so"
cp "$root/capi/gocoll.h" "$out/include/gocoll.h.tmp"
mv -f "$out/include/gocoll.h.tmp" "$out/include/gocoll.h"
sed "s/@VERSION@/$version/" "$root/build/gocoll.pc.in" >"$out/lib/pkgconfig/gocoll.pc"

echo "built $out/lib/$real (SONAME $soname), $out/include/gocoll.h, $out/lib/pkgconfig/gocoll.pc"
