#!/usr/bin/env bash
# `make fuzz`: runs each cargo-fuzz target (fuzz/fuzz_targets/, the bodies in src/fuzzing.rs)
# for FUZZ_SECONDS seconds (default 45, so about 7 minutes for the nine), starting from the
# committed seeds in fuzz/seeds/<target> plus whatever earlier runs left in fuzz/corpus/<target>
# (not committed). A crash stops the run with libFuzzer's report; the input is saved under
# fuzz/artifacts/ and belongs, minimized (`cargo +nightly fuzz tmin`), in
# fuzz/regressions/<target>/, which `make test` replays (tests/fuzz_replay.rs).
#
# With FUZZ_RUNS (`make fuzz-long`: 10,000,000), each target runs until it has executed that
# many inputs instead, with no time bound, and fails if it executed fewer.
#
# It fails, naming the target, when a target does not build, when libFuzzer exits with an
# error, or when it executed nothing; the last line lists each target with its executions.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${FUZZ_SECONDS:-45}
RUNS=${FUZZ_RUNS:-}
if [ -n "$RUNS" ]; then
  BOUND=(-runs="$RUNS")
  WHAT="$RUNS executions"
else
  BOUND=(-max_total_time="$SECONDS_PER_TARGET")
  WHAT="${SECONDS_PER_TARGET} s"
fi
TARGETS=${FUZZ_TARGETS:-"rules_yaml key_encoding proto_request json_body reference_env xds_config rlqs_reports limit_overrides simulate_scenario"}
LOGS=target/fuzz-logs
mkdir -p "$LOGS"

if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  echo "make fuzz: cargo-fuzz needs the nightly toolchain: rustup toolchain install nightly" >&2
  exit 1
fi
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked

summary=""
for t in $TARGETS; do
  mkdir -p "fuzz/corpus/$t" "fuzz/seeds/$t"
  echo "make fuzz: building $t" >&2
  # -O: release with debug assertions, as the crates' own fuzzing guides recommend.
  if ! cargo +nightly fuzz build --fuzz-dir fuzz -O "$t" >"$LOGS/$t.build.log" 2>&1; then
    tail -30 "$LOGS/$t.build.log" >&2
    echo "make fuzz: $t does not build (the whole log: $LOGS/$t.build.log)" >&2
    exit 1
  fi
  echo "make fuzz: $t for $WHAT" >&2
  status=0
  cargo +nightly fuzz run --fuzz-dir fuzz -O "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
    "${BOUND[@]}" -rss_limit_mb=2048 -print_final_stats=1 \
    >"$LOGS/$t.log" 2>&1 || status=$?
  grep -E '^(#[0-9]+.*DONE|stat::number_of_executed_units|stat::peak_rss_mb)|panicked|SUMMARY|Test unit written|ERROR' \
    "$LOGS/$t.log" >&2 || true
  execs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$LOGS/$t.log" | tail -1)
  if [ "$status" -ne 0 ] || compgen -G "fuzz/artifacts/$t/crash-*" >/dev/null \
     || compgen -G "fuzz/artifacts/$t/oom-*" >/dev/null || compgen -G "fuzz/artifacts/$t/timeout-*" >/dev/null; then
    tail -40 "$LOGS/$t.log" >&2
    echo "make fuzz: $t failed (libFuzzer exit $status; inputs under fuzz/artifacts/$t/, the log: $LOGS/$t.log)" >&2
    exit 1
  fi
  if [ -z "$execs" ] || [ "$execs" -eq 0 ]; then
    tail -20 "$LOGS/$t.log" >&2
    echo "make fuzz: $t executed nothing (the log: $LOGS/$t.log)" >&2
    exit 1
  fi
  if [ -n "$RUNS" ] && [ "$execs" -lt "$RUNS" ]; then
    echo "make fuzz: $t executed $execs of $RUNS (the log: $LOGS/$t.log)" >&2
    exit 1
  fi
  summary="$summary $t=$execs"
done
echo "make fuzz: no crash, leak or timeout; executions:$summary" >&2
