#!/bin/sh
# The demo: a Gorgonia MLP trained data-parallel on Fashion-MNIST with gocoll,
# on 1, 2 and 4 local rank processes in turn (shared memory between them).
# It prints a line per epoch, writes examples/sgd/out/report.md with loss
# plots, and ends with "test accuracy: 0.xxxx". Extra arguments go to the
# program (go run ./examples/sgd -h lists them).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build/deps.sh demo
exec go run ./examples/sgd "$@"
