#!/usr/bin/env bash
# `make fuzz`: runs each cargo-fuzz target (fuzz/fuzz_targets/) for FUZZ_SECONDS seconds
# (default 45, so about 3 minutes for the four), starting from the committed seeds in
# fuzz/seeds/<target> plus whatever earlier runs left in fuzz/corpus/<target> (not committed).
# A crash stops the run with libFuzzer's report; the input is saved under fuzz/artifacts/ and
# belongs, minimized, in a regression test of the normal suite. Not part of `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${FUZZ_SECONDS:-45}
TARGETS=${FUZZ_TARGETS:-"rules_yaml key_encoding proto_request json_body"}

if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  echo "make fuzz: cargo-fuzz needs the nightly toolchain: rustup toolchain install nightly" >&2
  exit 1
fi
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked

for t in $TARGETS; do
  mkdir -p "fuzz/corpus/$t" "fuzz/seeds/$t"
  echo "make fuzz: $t for ${SECONDS_PER_TARGET} s" >&2
  # -O: release with debug assertions, as the crates' own fuzzing guides recommend.
  cargo +nightly fuzz run --fuzz-dir fuzz -O "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
    -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=2048 -print_final_stats=1 2>&1 |
    grep -E '^(#[0-9]+.*DONE|stat::number_of_executed_units|stat::peak_rss_mb)|panicked|SUMMARY|Test unit written|ERROR' || true
  # grep hides libFuzzer's exit status: a crash leaves an artifact behind.
  if compgen -G "fuzz/artifacts/$t/crash-*" >/dev/null || compgen -G "fuzz/artifacts/$t/oom-*" >/dev/null \
     || compgen -G "fuzz/artifacts/$t/timeout-*" >/dev/null; then
    echo "make fuzz: $t found a failing input: fuzz/artifacts/$t/" >&2
    exit 1
  fi
done
echo "make fuzz: no crash, leak or timeout in ${TARGETS}" >&2
