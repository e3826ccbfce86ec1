#!/usr/bin/env bash
# Starts tollgate (memory store, examples/rules) and Envoy (examples/envoy/envoy.yaml, whose
# second listener is the stand-in upstream) on loopback; Ctrl-C stops both and exits 0. If either
# stops on its own (a port in use, a bad config), the other is stopped and the exit is 1.
#   curl -i -H 'x-tenant: acme' localhost:10000/search
set -euo pipefail
cd "$(dirname "$0")/.."
command -v envoy >/dev/null || bash scripts/deps.sh
cargo build --release -q
./target/release/tollgate serve --rules examples/rules --grpc-addr 127.0.0.1:8081 \
  --admin-addr 127.0.0.1:8080 --response-headers true &
tollgate_pid=$!
envoy -c examples/envoy/envoy.yaml --disable-hot-restart --log-level warn &
envoy_pid=$!
stop() { kill "$tollgate_pid" "$envoy_pid" 2>/dev/null || true; wait 2>/dev/null || true; }
trap stop EXIT
# Ctrl-C (or a TERM) is how the demo is meant to end: a clean stop, exit 0.
trap 'trap - EXIT; stop; echo; echo "envoy-demo: stopped"; exit 0' INT TERM
for _ in $(seq 100); do
  curl -sf localhost:9901/ready >/dev/null 2>&1 && curl -sf localhost:8080/readyz >/dev/null 2>&1 && break
  sleep 0.1
done
cat <<'TXT'
tollgate: gRPC 127.0.0.1:8081, admin http://127.0.0.1:8080   envoy: http://127.0.0.1:10000
try:  for i in $(seq 12); do curl -s -o /dev/null -w '%{http_code} ' -H 'x-tenant: t1' localhost:10000/export; done; echo
      curl -si -H 'x-tenant: t1' localhost:10000/export | grep -i -E '^(HTTP|x-ratelimit|retry-after|ratelimit)'
Ctrl-C stops both.
TXT
# Until Ctrl-C, or until one of them stops by itself, which is a failure.
set +e
wait -n "$tollgate_pid" "$envoy_pid"
echo "envoy-demo: $(kill -0 "$tollgate_pid" 2>/dev/null && echo envoy || echo tollgate) stopped on its own" >&2
exit 1
