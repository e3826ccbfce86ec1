#!/usr/bin/env bash
# `make explore`: the property tests on new cases. `make test` draws every property test's
# cases from one committed seed (src/testing.rs, tests/common/mod.rs), so CI is never surprised
# by a case drawn for the first time; this draws new ones: TOLLGATE_EXPLORE=1 gives each
# property test a random seed and ten times its cases, and each round gives the servers the
# harness starts a new seed for their own draws (replica ids, shard picks: src/random.rs).
#
# A property that fails saves its case under proptest-regressions/ (proptest's persistence);
# commit that file and `make test` replays the case on every run from then on. A failure of
# another test prints the round's TOLLGATE_TEST_SEED, which replays that round's draws.
#
#   EXPLORE_ROUNDS=20 bash scripts/explore.sh        (3 rounds by default; weekly on GitHub)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${EXPLORE_ROUNDS:-3}
# The binaries with property tests (the library's unit tests hold four), and the hot-key tests,
# whose shard picks the harness seed decides.
BINARIES=(tollgate lua_mirror lua_batch cluster hot_keys)
export TOLLGATE_EXPLORE=1
for round in $(seq "$ROUNDS"); do
  seed=$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')
  echo "explore: round $round of $ROUNDS (TOLLGATE_TEST_SEED=$seed)"
  if ! TOLLGATE_TEST_SEED=$seed python3 scripts/test_run.py "${BINARIES[@]}"; then
    echo "explore: round $round failed. A property test's case is saved under proptest-regressions/:" >&2
    git status --short proptest-regressions/ >&2 || true
    echo "explore: commit it so \`make test\` replays it; other failures replay with TOLLGATE_TEST_SEED=$seed" >&2
    exit 1
  fi
done
echo "explore: $ROUNDS rounds, no failure"
