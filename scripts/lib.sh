# Helpers shared by bench.sh, soak.sh and compare.sh (sourced, not run). The caller sets NAME (for
# messages), TMP (a scratch directory) and PIDS=() (the processes it starts) before sourcing,
# then `trap cleanup EXIT INT TERM`.

# Stops every process in PIDS and removes TMP.
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$TMP"
}

# A free loopback port (below 55536, so a cluster node's bus port +10000 stays valid and free).
free_port() {
  python3 -c 'import socket,random
while True:
    p = random.randint(20000, 45000)
    ok = True
    for q in (p, p + 10000):
        s = socket.socket()
        try: s.bind(("127.0.0.1", q))
        except OSError: ok = False
        finally: s.close()
    if ok: print(p); break'
}

wait_for() { # command… ; polls up to 15 s
  for _ in $(seq 150); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "$NAME: timed out waiting for: $*" >&2; return 1
}

# A throwaway redis-server on the loopback `port` (no persistence), in TMP, stopped by cleanup.
start_redis() { # port [extra redis-server args…]
  local port=$1; shift
  mkdir -p "$TMP/redis-$port"
  (cd "$TMP/redis-$port" && exec redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
     --daemonize no --logfile "$TMP/redis-$port/log" "$@") &
  PIDS+=($!)
  wait_for redis-cli -p "$port" ping
}
