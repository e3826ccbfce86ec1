#!/usr/bin/env bash
# What the memory path costs over the no-op RLS server, in instructions per request of the whole
# server process (gRPC, HTTP/2 and the decision), under valgrind's callgrind: the figure the
# store-ceiling goal "memory path within 1.5 µs of the no-op" is worked against, steady on a
# shared machine where CPU time moves by ±15 %. Each server is measured from after its start
# (instrumentation off until then) over a 6 s closed-loop run (10,000 keys, 4 in flight,
# after a 2 s warm-up), and the functions whose cost per request grew the most are listed.
#   bash scripts/path_instructions.sh [BINARY]     (default target/release/tollgate)
# Needs valgrind (Debian: valgrind). About a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/tollgate}
command -v valgrind >/dev/null || { echo "path_instructions: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
[ -x "$BIN" ] || cargo build --release -q
TMP=$(mktemp -d /tmp/tollgate-path.XXXXXX)
PIDS=()
NAME=path_instructions
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
trap cleanup EXIT INT TERM
write_admit_all_rules

measure() { # label port server-args…
  local label=$1 port=$2 vp; shift 2
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$TMP/$label.out" \
    "$BIN" "$@" >/dev/null 2>>"$TMP/servers.log" &
  vp=$!; PIDS+=($vp)
  wait_for bash -c "exec 3<>/dev/tcp/127.0.0.1/$port"
  "$BIN" bench --target 127.0.0.1:$port --duration 2 --warmup 0 --concurrency 4 --connections 1 \
    --keys 10000 --key tenant --quiet >/dev/null 2>&1
  callgrind_control -i on "$vp" >/dev/null 2>&1
  "$BIN" bench --target 127.0.0.1:$port --duration 6 --warmup 0 --concurrency 4 --connections 1 \
    --keys 10000 --key tenant --quiet 2>/dev/null | tail -1 > "$TMP/$label.json"
  callgrind_control -i off "$vp" >/dev/null 2>&1
  kill -INT "$vp"; wait "$vp" || true
  callgrind_annotate --inclusive=no --threshold=100 "$TMP/$label.out" > "$TMP/$label.txt" 2>/dev/null
}
G1=$(free_port); measure noop "$G1" bench-baseline --grpc-addr 127.0.0.1:$G1
G2=$(free_port); A2=$(free_port)
measure memory "$G2" serve --rules "$TMP/rules" --store memory --grpc-addr 127.0.0.1:$G2 \
  --admin-addr 127.0.0.1:$A2 --log-level warn

python3 - "$TMP" <<'PY'
import json, re, sys
tmp = sys.argv[1]
def load(label):
    n = max(json.load(open(f"{tmp}/{label}.json"))["total_requests"], 1)
    total = next(int(l.split()[1]) for l in open(f"{tmp}/{label}.out") if l.startswith("totals:"))
    per_fn, table = {}, False
    for line in open(f"{tmp}/{label}.txt"):
        if "file:function" in line:
            table = True
            continue
        if table and line.startswith("----") and per_fn:
            break
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)$", line) if table else None
        if m:
            fn = re.sub(r"\[.*\]$", "", m.group(2)).strip()
            fn = fn.split(":", 1)[1] if ":" in fn else fn
            per_fn[fn] = per_fn.get(fn, 0) + int(m.group(1).replace(",", "")) / n
    return n, total / n, per_fn
(n0, noop, f0), (n1, mem, f1) = load("noop"), load("memory")
print(f"no-op  {noop:>9,.0f} instructions per request ({n0:,} requests)")
print(f"memory {mem:>9,.0f} instructions per request ({n1:,} requests): {mem - noop:+,.0f} ({(mem - noop) / noop:+.1%})")
print("\nGrew the most per request (self cost, no-op → memory):")
grew = sorted(((f1.get(k, 0) - f0.get(k, 0), k) for k in set(f0) | set(f1)), reverse=True)
for d, k in grew[:20]:
    print(f"  {d:+7,.0f}  {k[:120]}")
PY
