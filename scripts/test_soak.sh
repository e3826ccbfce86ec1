#!/usr/bin/env bash
# `make test-soak`: the suite's truth on a busy machine. Runs the test binaries RUNS (3) times
# through the suite's own runner (scripts/test_run.py, JOBS at a time as `make test` does) while
# one busy loop per core runs at `nice 10`, and prints per binary its wall and CPU times and
# per test how often it failed.
#
#   bash scripts/test_soak.sh [BINARY …]          (default: the whole suite)
#   RUNS=10 bash scripts/test_soak.sh deadlines refund_bounds
#
# HOG=0 runs without the busy loops. Exits 1 when any test failed in any run; the failing
# runs' output is kept under target/test-runs/.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3} HOG=${HOG:-1} exec python3 scripts/test_run.py "$@"
