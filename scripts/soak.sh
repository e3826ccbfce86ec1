#!/usr/bin/env bash
# `make soak`: steady load on the Redis store for SOAK_DURATION seconds (default 600), across
# SOAK_KEYS distinct keys (default 1,000,000), at SOAK_RATE requests/s (default 5,000, open
# loop: a fixed schedule); tollgate's resident memory sampled every SOAK_SAMPLE seconds (default
# 5) into a CSV, plotted as an SVG, and judged: after the first minute, RSS must stay within
# ±10 % of its median, with no errors. Exit 1 when it does not. Not part of `make test`.
# Output: target/soak/rss.csv, target/soak/rss.svg (SOAK_OUT to change the directory).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v redis-server >/dev/null || bash scripts/deps.sh

DURATION=${SOAK_DURATION:-600}
KEYS=${SOAK_KEYS:-1000000}
RATE=${SOAK_RATE:-5000}
SAMPLE=${SOAK_SAMPLE:-5}
OUT=${SOAK_OUT:-target/soak}

cargo build --release -q
BIN=target/release/tollgate
TMP=$(mktemp -d /tmp/tollgate-soak.XXXXXX)
PIDS=()
NAME=soak
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
trap cleanup EXIT INT TERM

RP=$(free_port); start_redis "$RP"

mkdir -p "$TMP/rules" "$OUT"
cat > "$TMP/rules/soak.yaml" <<'YAML'
domain: soak
descriptors:
  # High enough that the soak measures steady decisions, not rejections.
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 1000000}
YAML
GRPC=$(free_port); ADMIN=$(free_port)
"$BIN" serve --rules "$TMP/rules" --store "redis://127.0.0.1:$RP" --grpc-addr "127.0.0.1:$GRPC" \
  --admin-addr "127.0.0.1:$ADMIN" --log-level warn >/dev/null 2>"$TMP/tollgate.log" &
PIDS+=($!); SERVER=$!
wait_for curl -sf "127.0.0.1:$ADMIN/readyz"

echo "soak: ${DURATION} s at ${RATE} req/s over ${KEYS} keys (Redis store); RSS every ${SAMPLE} s → $OUT/rss.csv" >&2
"$BIN" bench --target "127.0.0.1:$GRPC" --domain soak --key tenant --keys "$KEYS" --rate "$RATE" \
  --duration "$DURATION" --warmup 0 --target-pid "$SERVER" --quiet > "$TMP/bench.out" &
LOAD=$!
CSV="$OUT/rss.csv"
echo "seconds,rss_kib,redis_used_memory_bytes" > "$CSV"
START=$(date +%s)
while kill -0 "$LOAD" 2>/dev/null; do
  t=$(( $(date +%s) - START ))
  rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$SERVER/status")
  used=$(redis-cli -p "$RP" info memory | tr -d '\r' | awk -F: '/^used_memory:/ {print $2}')
  echo "$t,$rss,$used" >> "$CSV"
  sleep "$SAMPLE"
done
wait "$LOAD"
kill -0 "$SERVER" 2>/dev/null || { echo "soak: tollgate died; its log:" >&2; cat "$TMP/tollgate.log" >&2; exit 1; }

python3 - "$CSV" "$OUT/rss.svg" "$TMP/bench.out" "$RATE" "$KEYS" <<'PY'
import csv, json, statistics, sys
rows = [(int(r["seconds"]), int(r["rss_kib"]) / 1024) for r in csv.DictReader(open(sys.argv[1]))]
report = json.loads(open(sys.argv[3]).read().strip().splitlines()[-1])
rate, keys = sys.argv[4], int(sys.argv[5])
steady = [m for t, m in rows if t >= 60] or [m for _, m in rows]
median = statistics.median(steady)
lo, hi = min(steady), max(steady)
dev = max(abs(lo - median), abs(hi - median)) / median * 100
flat = dev <= 10.0
ok = flat and report["errors"] == 0
verdict = "flat" if flat else "NOT flat"
print(f"soak: {rows[-1][0]} s, {report['requests']:,} requests at {report['rps']:,.0f} req/s over {keys:,} keys, "
      f"{report['errors']} errors, p99 {report['p99_us']} µs, server CPU {report.get('server_cpu_us_per_request') or 0:.1f} µs/request")
print(f"soak: RSS after the first minute: median {median:.1f} MiB, min {lo:.1f}, max {hi:.1f} "
      f"(±{dev:.1f} % of the median; bound ±10 %): {verdict}")

# The picture: RSS over time, with the median and the ±10 % band after the first minute.
W, H, L, R, T, B = 720, 360, 70, 20, 40, 50
tmax = max(t for t, _ in rows) or 1
ymax = max(max(m for _, m in rows) * 1.2, median * 1.15)
def x(t): return L + t / tmax * (W - L - R)
def y(m): return T + (1 - m / ymax) * (H - T - B)
out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<text x="{W/2}" y="20" text-anchor="middle" font-size="14">tollgate RSS under steady load ({rate} req/s, {keys:,} keys, Redis store): {verdict}</text>',
       f'<rect x="{x(60):.1f}" y="{y(median * 1.1):.1f}" width="{x(tmax) - x(60):.1f}" height="{y(median * 0.9) - y(median * 1.1):.1f}" fill="#e8f3e8"/>',
       f'<line x1="{x(60):.1f}" x2="{x(tmax):.1f}" y1="{y(median):.1f}" y2="{y(median):.1f}" stroke="#2ca02c" stroke-dasharray="4,3"/>']
step = 10 ** max(0, len(str(int(ymax))) - 1)
v = 0
while v <= ymax:
    out.append(f'<line x1="{L}" x2="{W-R}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#eeeeee"/><text x="{L-6}" y="{y(v)+4:.1f}" text-anchor="end">{v:g} MiB</text>')
    v += step
for t in range(0, tmax + 1, max(60, tmax // 10 // 60 * 60)):
    out.append(f'<text x="{x(t):.1f}" y="{H-B+16}" text-anchor="middle">{t} s</text>')
out.append(f'<line x1="{L}" x2="{W-R}" y1="{H-B}" y2="{H-B}" stroke="black"/><line x1="{L}" x2="{L}" y1="{T}" y2="{H-B}" stroke="black"/>')
out.append(f'<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="{" ".join(f"{x(t):.1f},{y(m):.1f}" for t, m in rows)}"/>')
out.append(f'<text x="{W-R}" y="{H-12}" text-anchor="end" fill="#555555">median {median:.1f} MiB after 60 s (dashed), ±10 % shaded; max deviation ±{dev:.1f} %</text>')
out.append("</svg>")
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print(f"soak: plot {sys.argv[2]}, samples {sys.argv[1]}")
sys.exit(0 if ok else 1)
PY
