#!/usr/bin/env bash
# W2 on one node, on three independent single nodes, and on a 3-node cluster, alternating
# (bench/README.md, "What part of the gap is the hop"): how much of the cluster's cost is the
# hop between nodes, and how much is three processes sharing this machine's disk and cores.
# Usage: bench/independent.sh [ROUNDS]   (default 2; ~1.5 min a round). Loopback only; uses the
# release binaries as they are (cargo build --release --bin narad; -p narad-bench --bin loadgen).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROUNDS=${1:-2}
B=${NARAD:-$ROOT/target/release/narad}
LG=$ROOT/target/release/loadgen
WORK=$(mktemp -d -t narad-indep.XXXXXX)
PIDS=()
stop_all() { [ ${#PIDS[@]} -gt 0 ] && kill "${PIDS[@]}" 2>/dev/null; sleep 1; PIDS=(); }
trap 'stop_all; rm -rf "$WORK"' EXIT INT TERM
ready() { for _ in $(seq 150); do curl -sf "localhost:$1/readyz" >/dev/null && return 0; sleep 0.2; done; return 1; }
w2() { # name, urls, pids
  "$LG" "$1" --url "$2" --workload w2 --partitions 12 --duration 8 --server-pid "$3" 2>&1 | grep -E "^W2"
}
one() {
  mkdir -p "$WORK/o1"
  env -u NARAD_CLUSTER_PEERS "$B" server start --dev --port 18600 --data-dir "$WORK/o1" >"$WORK/o1.log" 2>&1 &
  PIDS=($!)
  ready 18600 && w2 one http://127.0.0.1:18600 "${PIDS[0]}"
  stop_all; rm -rf "$WORK/o1"
}
independent() {
  for i in 1 2 3; do
    mkdir -p "$WORK/i$i"
    env -u NARAD_CLUSTER_PEERS NARAD_SHARDS=1 "$B" server start --dev --port 1850$i \
      --data-dir "$WORK/i$i" >"$WORK/i$i.log" 2>&1 &
    PIDS+=($!)
  done
  for i in 1 2 3; do
    ready 1850$i
    curl -s -XPOST "localhost:1850$i/v1/topics" -H 'content-type: application/json' \
      -d '{"name":"ind","partitions":12}' >/dev/null
  done
  w2 ind http://127.0.0.1:18501,http://127.0.0.1:18502,http://127.0.0.1:18503 "$(IFS=,; echo "${PIDS[*]}")"
  stop_all; rm -rf "$WORK"/i*
}
cluster() {
  local peers="n1@127.0.0.1:18101,n2@127.0.0.1:18201,n3@127.0.0.1:18301"
  for i in 1 2 3; do
    mkdir -p "$WORK/c$i"
    env -u NARAD_CLUSTER_SECRET NARAD_SHARDS=1 NARAD_NODE_ID=n$i NARAD_CLUSTER_PEERS=$peers \
      NARAD_CLUSTER_ADDR=127.0.0.1:18${i}01 NARAD_SECURITY_ALLOW_INSECURE_CLUSTER=true \
      "$B" server start --dev --port 18${i}00 --data-dir "$WORK/c$i" >"$WORK/c$i.log" 2>&1 &
    PIDS+=($!)
  done
  for i in 1 2 3; do ready 18${i}00; done
  w2 cl http://127.0.0.1:18100,http://127.0.0.1:18200,http://127.0.0.1:18300 "$(IFS=,; echo "${PIDS[*]}")"
  stop_all; rm -rf "$WORK"/c*
}
for ((r = 1; r <= ROUNDS; r++)); do
  echo "== round $r: one node (default shards)"; one
  echo "== round $r: three independent nodes (1 shard each)"; independent
  echo "== round $r: 3-node cluster (1 shard each)"; cluster
done
