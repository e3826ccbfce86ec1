# Helpers shared by bench.sh, store_cost.sh, path_instructions.sh, soak.sh, compare.sh and
# compare_instructions.sh (sourced, not run). The caller sets NAME (for messages), TMP (a
# scratch directory) and PIDS=() (the processes it starts) before sourcing, then
# `trap cleanup EXIT INT TERM`.

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

# A 3-node Redis Cluster (no replicas) on three free loopback ports, stopped by cleanup; sets
# C1 C2 C3 (the ports) and CLUSTER_URL (redis+cluster://… naming all three).
start_cluster() {
  C1=$(free_port); C2=$(free_port); C3=$(free_port)
  for p in $C1 $C2 $C3; do start_redis "$p" --cluster-enabled yes --cluster-config-file nodes.conf; done
  redis-cli --cluster create 127.0.0.1:$C1 127.0.0.1:$C2 127.0.0.1:$C3 --cluster-replicas 0 --cluster-yes >/dev/null
  for p in $C1 $C2 $C3; do wait_for bash -c "redis-cli -p $p cluster info | grep -q cluster_state:ok"; done
  CLUSTER_URL="redis+cluster://127.0.0.1:$C1,127.0.0.1:$C2,127.0.0.1:$C3"
}

# What compare.sh and compare_instructions.sh put two binaries side by side on: a Redis and a
# 3-node cluster (started), the rules in TMP/rules (one limit high enough that every request is
# a decision that admits), and STORES (memory, the Redis URL, the cluster URL).
start_compare_stores() {
  RP=$(free_port); start_redis "$RP"
  start_cluster
  write_admit_all_rules
  STORES=(memory "redis://127.0.0.1:$RP" "$CLUSTER_URL")
}

# TMP/rules/bench.yaml: domain `bench`, key `tenant`, one limit high enough that every request
# is a decision that admits (and writes its bucket).
write_admit_all_rules() {
  mkdir -p "$TMP/rules"
  cat > "$TMP/rules/bench.yaml" <<'YAML'
domain: bench
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1000000000}
YAML
}

# What Redis counted of its script calls (INFO commandstats), summed over the servers on the ports.
script_stat() { # field ports…: INFO commandstats' <field> (calls, usec) of EVALSHA and EVAL, summed over the ports
  local field=$1 total=0 n; shift
  for p in "$@"; do
    n=$(redis-cli -p "$p" info commandstats | tr -d '\r' | awk -F'[:=,]' -v f="$field" \
      '/^cmdstat_(evalsha|eval):/ { for (i = 2; i < NF; i += 2) if ($i == f) s += $(i + 1) } END {print s+0}')
    total=$((total + n))
  done
  echo "$total"
}
script_calls() { script_stat calls "$@"; } # ports…: script calls so far
script_usec() { script_stat usec "$@"; }   # ports…: µs Redis spent inside script calls so far (its own count: the scripts' work, not the protocol's)
