#!/usr/bin/env bash
# Two tollgate binaries side by side: server CPU µs per request (tollgate bench --target-pid),
# alternating passes, on the memory store, one Redis and a 3-node Redis Cluster (100,000 keys,
# 32 calls in flight on 4 connections). For "is this change slower": build the old commit into its own target
# directory (git worktree add /tmp/old <rev>; CARGO_TARGET_DIR=/tmp/old-target cargo build
# --release there) and compare:
#   bash scripts/compare.sh /tmp/old-target/release/tollgate target/release/tollgate
# PASSES (3) per store; each pass runs old then new. The machine is shared and noisy: read the
# medians, and the spread of each side's passes.
set -euo pipefail
OLD=$1 NEW=$2 PASSES=${PASSES:-3}
cd "$(dirname "$0")/.."
TMP=$(mktemp -d /tmp/tollgate-compare.XXXXXX)
PIDS=()
NAME=compare
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
trap cleanup EXIT INT TERM
start_compare_stores
start() { # binary store key-prefix → SG (gRPC port), SPID
  local g a; g=$(free_port); a=$(free_port)
  "$1" serve --rules "$TMP/rules" --store "$2" --key-prefix "$3" --grpc-addr 127.0.0.1:$g --admin-addr 127.0.0.1:$a \
    --log-level warn --store-timeout-ms 100 >/dev/null 2>>"$TMP/servers.log" &
  PIDS+=($!); SPID=$!; SG=$g
  wait_for curl -sf "127.0.0.1:$a/readyz"
}
for store in "${STORES[@]}"; do
  start "$OLD" "$store" old:; OG=$SG; OP=$SPID
  start "$NEW" "$store" new:; NG=$SG; NP=$SPID
  for _ in $(seq "$PASSES"); do
    for who in old new; do
      if [ $who = old ]; then g=$OG p=$OP; else g=$NG p=$NP; fi
      "$NEW" bench --target 127.0.0.1:$g --duration 5 --warmup 1 --concurrency 32 --connections 4 --keys 100000 \
        --key tenant --label "$who ${store%%:*}" --target-pid "$p" --quiet | tail -1 |
        python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print("{:18} {:>7} req/s  {:6.1f} CPU us/request  p99 {} us".format(d["label"], int(d["rps"]), d["server_cpu_us_per_request"], d["p99_us"]))'
    done
  done
done
