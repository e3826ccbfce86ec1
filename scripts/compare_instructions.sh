#!/usr/bin/env bash
# Two tollgate binaries side by side, in instructions per request: each server runs under
# valgrind's callgrind, collecting only inside the RateLimitService impl's poll,
# `Rls::should_rate_limit` (the decision path: bounds, rules, limiter, store call, response; not
# tonic's or h2's framing; `Handler::should_rate_limit`'s future is inlined into that poll, so a
# toggle on the handler alone counted 9 instructions a request), while
# `tollgate bench` sends a few thousand requests (100,000 keys, 4 in flight, no warm-up).
# Instruction counts do not move with the load of a shared machine the way CPU time does:
# differences of a few tenths of a percent are real. Stores: memory, one Redis, a 3-node
# Redis Cluster. Build the old commit as for compare.sh, then:
#   bash scripts/compare_instructions.sh /tmp/old-target/release/tollgate target/release/tollgate
# Needs valgrind (Debian: valgrind). About 2 minutes.
set -euo pipefail
OLD=$1 NEW=$2 SECONDS_EACH=${SECONDS_EACH:-8}
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "compare_instructions: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
TMP=$(mktemp -d /tmp/tollgate-instructions.XXXXXX)
PIDS=()
NAME=compare_instructions
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
trap cleanup EXIT INT TERM
start_compare_stores
measure() { # binary label store
  local g a out="$TMP/$2.callgrind" vp
  g=$(free_port); a=$(free_port)
  valgrind --tool=callgrind --callgrind-out-file="$out" --toggle-collect='*service*rls*Rls*should_rate_limit*' \
    "$1" serve --rules "$TMP/rules" --store "$3" --key-prefix "$2:" --grpc-addr 127.0.0.1:$g \
    --admin-addr 127.0.0.1:$a --log-level warn --store-timeout-ms 2000 --store-connect-timeout-ms 5000 \
    >/dev/null 2>>"$TMP/servers.log" &
  vp=$!; PIDS+=($vp)
  # Under valgrind the server starts in seconds, not milliseconds.
  for _ in $(seq 600); do curl -sf "127.0.0.1:$a/readyz" >/dev/null && break; sleep 0.1; done
  "$NEW" bench --target 127.0.0.1:$g --duration "$SECONDS_EACH" --warmup 0 --concurrency 4 --connections 1 \
    --keys 100000 --key tenant --quiet | tail -1 > "$TMP/$2.json"
  kill -INT "$vp"; wait "$vp" || true
  python3 - "$2" "$out" "$TMP/$2.json" <<'PY'
import json, sys
label, out, report = sys.argv[1:]
ir = next(int(l.split()[1]) for l in open(out) if l.startswith(("summary:", "totals:")))
n = json.load(open(report))["total_requests"]
print(f"{label:22} {n:>6} requests  {ir // max(n, 1):>7} instructions/request")
PY
}
for store in "${STORES[@]}"; do
  for who in old new; do
    if [ $who = old ]; then bin=$OLD; else bin=$NEW; fi
    measure "$bin" "$who-${store%%:*}" "$store"
  done
done
