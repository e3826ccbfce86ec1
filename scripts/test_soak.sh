#!/usr/bin/env bash
# `make test-soak`: the suite's truth on a busy machine. Runs test binaries RUNS times each while
# a hog keeps every core busy (one busy loop per core at `nice 10`: a nice-19 hog is too gentle
# to show anything, an equal-priority one would starve the 20 ms deadline tests of any chance),
# and prints, per binary, its wall times, and per test, how often it failed.
#
#   bash scripts/test_soak.sh [BINARY …]          (default: every tests/*.rs binary)
#   RUNS=10 HOG=0 bash scripts/test_soak.sh deadlines refund_bounds
#
# RUNS (3): runs of each binary, one after another. HOG (1): 0 runs without the hog. The
# binaries are built once first (`cargo test --no-run`), so the runs time the tests, not cargo.
# Exits 1 when any test failed in any run; the failing runs' output is kept under target/soak/.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
HOG=${HOG:-1}
OUT=target/soak
mkdir -p "$OUT"

if [ $# -eq 0 ]; then
  set -- $(ls tests/*.rs | xargs -n1 basename | sed 's/\.rs$//')
fi
targets=()
for b in "$@"; do targets+=(--test "$b"); done
cargo test -q --no-run "${targets[@]}" 2>&1 | grep -v '^ *Executable' || true

HOGS=()
stop_hogs() {
  for p in "${HOGS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
}
trap stop_hogs EXIT INT TERM
if [ "$HOG" = 1 ]; then
  for _ in $(seq "$(nproc)"); do
    nice -n 10 bash -c 'while :; do :; done' &
    HOGS+=($!)
  done
  echo "soak: $(nproc) busy loops at nice 10"
fi

failed_any=0
printf '%-22s %5s %8s %8s %8s  %s\n' binary runs min_s med_s max_s failures
for b in "$@"; do
  times=()
  : > "$OUT/$b.failures"
  for i in $(seq "$RUNS"); do
    start=$(date +%s.%N)
    if cargo test -q --test "$b" > "$OUT/$b.$i.log" 2>&1; then
      rm -f "$OUT/$b.$i.log"
    else
      failed_any=1
      grep -E '^test .* FAILED$' "$OUT/$b.$i.log" | sed 's/^test //; s/ \.\.\. FAILED$//' >> "$OUT/$b.failures" || true
      grep -qE '^test .* FAILED$' "$OUT/$b.$i.log" || echo "(the binary failed without a failing test: see $OUT/$b.$i.log)" >> "$OUT/$b.failures"
    fi
    times+=("$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')")
  done
  stats=$(printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {printf "%8.1f %8.1f %8.1f", a[1], a[int((NR+1)/2)], a[NR]}')
  fails=$(sort "$OUT/$b.failures" | uniq -c | awk '{printf "%s×%s ", $1, $2}')
  printf '%-22s %5s %s  %s\n' "$b" "$RUNS" "$stats" "${fails:-none}"
done
exit "$failed_any"
