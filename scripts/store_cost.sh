#!/usr/bin/env bash
# What one exact decision costs, side by side in one run (part of `make bench`; alone: `bash
# scripts/store_cost.sh`): the no-op RLS baseline, the memory store, Redis with decisions batched
# per node (the default), Redis without (`--store-batch-max-ops 1`: one script call per op, as
# before batching), and a 3-node Redis Cluster batched per node (the default) and not; each at 1
# and at 64 requests in flight over
# 10,000 keys. Per row: req/s, p50, tollgate's CPU µs per request and that minus the no-op's at
# the same concurrency, the store's CPU µs per decision (redis-server's own user + system time
# from /proc, every node of the cluster summed: its protocol work included), the µs Redis counts
# inside its script calls per decision (INFO commandstats usec: the scripts' own work) and its
# script calls per decision. The row `redis-fixed-window` is the batched Redis path with
# `--default-algorithm fixed_window` (the reference's algorithm, and the default of a replica
# started as `ratelimit`). CPU time, not req/s, is the figure to compare on a shared
# machine. BENCH_COST_DURATION seconds per row (default 6) + 2 s warm-up; two passes in opposite
# orders, each row's better pass shown. BENCH_COST_BEFORE=<an older tollgate binary> adds its
# batched Redis paths as the rows `redis-before` and `fixed-window-before`, on the same Redis
# in the same run (before and
# after side by side: build the old one with `git worktree add /tmp/old <rev>` and
# `CARGO_TARGET_DIR=/tmp/old-target cargo build --release` there).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v redis-server >/dev/null || bash scripts/deps.sh

DURATION=${BENCH_COST_DURATION:-6}
KEYS=10000
cargo build --release -q
BIN=target/release/tollgate
TMP=$(mktemp -d /tmp/tollgate-cost.XXXXXX)
PIDS=()
NAME=store-cost
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
trap cleanup EXIT INT TERM

RP=$(free_port); start_redis "$RP"; REDIS_PID=${PIDS[-1]}
start_cluster; CLUSTER_PIDS=("${PIDS[@]: -3}")
write_admit_all_rules

start_tollgate() { # name store [extra flags…]; sets GRPC and PID (the binary: $SERVE_BIN or $BIN)
  local name=$1 store=$2 admin; shift 2; GRPC=$(free_port); admin=$(free_port)
  "${SERVE_BIN:-$BIN}" serve --rules "$TMP/rules" --store "$store" --grpc-addr 127.0.0.1:$GRPC --admin-addr 127.0.0.1:$admin \
    --log-level warn "$@" >/dev/null 2>"$TMP/$name.log" &
  PIDS+=($!); PID=$!
  wait_for curl -sf "127.0.0.1:$admin/readyz"
}
NOOP=$(free_port)
"$BIN" bench-baseline --grpc-addr 127.0.0.1:$NOOP >/dev/null 2>"$TMP/noop.log" &
PIDS+=($!); NOOP_PID=$!
wait_for bash -c "exec 3<>/dev/tcp/127.0.0.1/$NOOP"
start_tollgate memory memory; MEM=$GRPC; MEM_PID=$PID
start_tollgate batched "redis://127.0.0.1:$RP" --key-prefix batched:; BAT=$GRPC; BAT_PID=$PID
start_tollgate unbatched "redis://127.0.0.1:$RP" --key-prefix unbatched: --store-batch-max-ops 1; UNB=$GRPC; UNB_PID=$PID
start_tollgate fixed "redis://127.0.0.1:$RP" --key-prefix fixed: --default-algorithm fixed_window; FIX=$GRPC; FIX_PID=$PID
start_tollgate cluster "$CLUSTER_URL" --key-prefix batched:; CLU=$GRPC; CLU_PID=$PID
start_tollgate cluster-unbatched "$CLUSTER_URL" --key-prefix unbatched: --store-batch-max-ops 1; CLU1=$GRPC; CLU1_PID=$PID
BEFORE=${BENCH_COST_BEFORE:-}
if [ -n "$BEFORE" ]; then
  SERVE_BIN=$BEFORE start_tollgate before "redis://127.0.0.1:$RP" --key-prefix before:; BEF=$GRPC; BEF_PID=$PID
  SERVE_BIN=$BEFORE start_tollgate fixed-before "redis://127.0.0.1:$RP" --key-prefix fixed-before: \
    --default-algorithm fixed_window; FIXB=$GRPC; FIXB_PID=$PID
fi

RESULTS="$TMP/cost.jsonl"
: > "$RESULTS"
run() { # label target server-pid in-flight "store-pids" redis-ports…
  local label=$1 target=$2 pid=$3 inflight=$4 store_pids=$5; shift 5
  local before after usec_before usec_after flags=() conns=4
  [ "$inflight" -lt 4 ] && conns=$inflight
  for p in $store_pids; do flags+=(--store-pid "$p"); done
  before=$(script_calls "$@"); usec_before=$(script_usec "$@")
  echo "store-cost: $label, $inflight in flight…" >&2
  line=$("$BIN" bench --target "127.0.0.1:$target" --duration "$DURATION" --warmup 2 \
     --concurrency "$inflight" --connections "$conns" --keys $KEYS --key tenant --label "$label" \
     --target-pid "$pid" "${flags[@]}" --quiet | tail -1)
  after=$(script_calls "$@"); usec_after=$(script_usec "$@")
  echo "$line" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); d["script_calls"]=int(sys.argv[1]); d["script_usec"]=int(sys.argv[2]); print(json.dumps(d))' \
    "$((after - before))" "$((usec_after - usec_before))" >> "$RESULTS"
}

for pass in 1 2; do
  order="baseline memory batched fixed unbatched cluster cluster1"
  [ $pass = 2 ] && order="cluster1 cluster unbatched fixed batched memory baseline"
  [ -n "$BEFORE" ] && order="${order/batched /batched before }" && order="${order/fixed /fixed fixed-before }"
  for inflight in 1 64; do
    for s in $order; do
      case $s in
        baseline) run baseline "$NOOP" "$NOOP_PID" $inflight "" ;;
        memory) run memory "$MEM" "$MEM_PID" $inflight "" ;;
        batched) run redis-batched "$BAT" "$BAT_PID" $inflight "$REDIS_PID" "$RP" ;;
        before) run redis-before "$BEF" "$BEF_PID" $inflight "$REDIS_PID" "$RP" ;;
        fixed) run redis-fixed-window "$FIX" "$FIX_PID" $inflight "$REDIS_PID" "$RP" ;;
        fixed-before) run fixed-window-before "$FIXB" "$FIXB_PID" $inflight "$REDIS_PID" "$RP" ;;
        unbatched) run redis-unbatched "$UNB" "$UNB_PID" $inflight "$REDIS_PID" "$RP" ;;
        cluster) run cluster-batched "$CLU" "$CLU_PID" $inflight "${CLUSTER_PIDS[*]}" "$C1" "$C2" "$C3" ;;
        cluster1) run cluster-unbatched "$CLU1" "$CLU1_PID" $inflight "${CLUSTER_PIDS[*]}" "$C1" "$C2" "$C3" ;;
      esac
    done
  done
done

python3 - "$RESULTS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
best = {}
for r in rows:
    k = (r["label"], r["concurrency"])
    cpu = r.get("server_cpu_us_per_request") or 1e9
    if k not in best or cpu < (best[k].get("server_cpu_us_per_request") or 1e9):
        best[k] = r
print()
print("What one exact decision costs (10,000 keys; each row the better of two passes):")
print()
print("| path | in flight | req/s | p50 µs | tollgate CPU µs / request | over the no-op | store CPU µs / decision | of it in scripts (Redis's count) | script calls / decision |")
print("|---|---|---|---|---|---|---|---|---|")
for inflight in (1, 64):
    base = best.get(("baseline", inflight), {}).get("server_cpu_us_per_request")
    for label in ("baseline", "memory", "redis-batched", "redis-before", "redis-fixed-window", "fixed-window-before", "redis-unbatched", "cluster-batched", "cluster-unbatched"):
        r = best.get((label, inflight))
        if not r:
            continue
        cpu = r.get("server_cpu_us_per_request")
        over = f"{cpu - base:+.1f}" if cpu is not None and base is not None and label != "baseline" else "–"
        store = r.get("store_cpu_us_per_request")
        store = f"{store:.1f}" if store is not None else "–"
        n = r["total_requests"] * r["descriptors"] or 1
        calls = f'{r["script_calls"] / n:.3f}' if label not in ("baseline", "memory") else "–"
        inside = f'{r["script_usec"] / n:.1f}' if label not in ("baseline", "memory") else "–"
        print(f'| {label} | {inflight} | {r["rps"]:,.0f} | {r["p50_us"]} | {cpu:.1f} | {over} | {store} | {inside} | {calls} |')
PY
