#!/usr/bin/env bash
# Benchmarks Narad against the HTTP ceiling of this machine, in one run (issue 4).
#
#  1. builds release binaries (narad, loadgen);
#  2. installs nginx from the distribution's packages if it is missing, and starts it on a
#     loopback port answering 202 to every request without doing anything (the ceiling);
#  3. starts the broker (`narad server start --dev`) on a fresh temporary data directory;
#  4. runs W1 against nginx (the ceiling), then W1, W2, W3 and W4 against the broker with the
#     same generator, and prints every figure with its ratio to the ceiling;
#  5. stops what it started and removes the temporary directories;
#  6. then runs W1, W2, W3 and W4@5k on one node and on a 3-node loopback cluster side by side
#     (bench/cluster.sh, CLUSTER_ROUNDS rounds, default 1; 0 skips it; issue 31).
#
# Usage: bench/run.sh [loadgen flags...]     e.g. bench/run.sh --duration 5
# Environment: DURATION (seconds per workload, default 10), BROKER_PORT (17942), NGINX_PORT
# (18080), NARAD_SHARDS (broker shards, default one per CPU), OUT (JSON report path,
# default bench-report.json in the current directory), WRK=0 to skip the wrk cross-check,
# CLUSTER_ROUNDS (rounds of the one-node/3-node comparison, default 1, 0 to skip).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
DURATION=${DURATION:-10}
OUT=${OUT:-$PWD/bench-report.json}

# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

echo "== building release binaries"
cargo build --release --bin narad
cargo build --release -p narad-bench --bin loadgen

if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
  echo "== installing nginx from the distribution's packages"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nginx
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

WORK=$(mktemp -d -t narad-bench.XXXXXX)
DATA=$(mktemp -d -t narad-data.XXXXXX)
BROKER_PID=""
cleanup() {
  if [ -f "$WORK/nginx.pid" ]; then
    "$NGINX" -c "$WORK/nginx.conf" -p "$WORK" -s stop 2>/dev/null || true
  fi
  if [ -n "$BROKER_PID" ]; then
    kill "$BROKER_PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$BROKER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$BROKER_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK" "$DATA"
}
trap cleanup EXIT INT TERM

NGINX_PORT=$(free_port "${NGINX_PORT:-18080}")
write_nginx_conf "$WORK" "$NGINX_PORT"
echo "== nginx (ceiling) on 127.0.0.1:$NGINX_PORT"
"$NGINX" -c "$WORK/nginx.conf" -p "$WORK" -e "$WORK/logs/error.log"
wait_port "$NGINX_PORT" 10 || { echo "nginx did not start" >&2; cat "$WORK/logs/error.log" >&2; exit 1; }
NGINX_PID=$(cat "$WORK/nginx.pid")

BROKER_PORT=$(free_port "${BROKER_PORT:-17942}")
echo "== narad on 127.0.0.1:$BROKER_PORT, data in $DATA"
target/release/narad server start --dev --port "$BROKER_PORT" --data-dir "$DATA" \
  >"$WORK/narad.log" 2>&1 &
BROKER_PID=$!
wait_port "$BROKER_PORT" 60 || { echo "narad did not start" >&2; tail -20 "$WORK/narad.log" >&2; exit 1; }

if [ "${WRK:-1}" != 0 ] && command -v wrk >/dev/null 2>&1; then
  # Cross-check that the generator is not the bottleneck: wrk against the same nginx.
  printf 'wrk.method="POST"\nwrk.body=string.rep("x",256)\nwrk.headers["Content-Type"]="application/octet-stream"\n' \
    >"$WORK/post.lua"
  echo "== wrk -t2 -c64 against nginx (reference for the generator's own ceiling)"
  wrk -t2 -c64 -d5s -s "$WORK/post.lua" "http://127.0.0.1:$NGINX_PORT/v1/topics/bench/produce" |
    grep -E 'Requests/sec|Latency' || true
fi

echo "== generator: ceiling, then W1..W4 against the broker ($DURATION s each)"
target/release/loadgen bench --url "http://127.0.0.1:$BROKER_PORT" --workload all \
  --ceiling-url "http://127.0.0.1:$NGINX_PORT" --ceiling-pid "$NGINX_PID" \
  --server-pid "$BROKER_PID" --duration "$DURATION" --json-out "$OUT" "$@"
echo "== JSON report: $OUT"

CLUSTER_ROUNDS=${CLUSTER_ROUNDS:-1}
if [ "$CLUSTER_ROUNDS" != 0 ]; then
  cleanup
  trap - EXIT INT TERM
  echo "== one node against a 3-node loopback cluster (bench/cluster.sh $CLUSTER_ROUNDS, $DURATION s per workload)"
  BUILD=0 DURATION="$DURATION" "$ROOT/bench/cluster.sh" "$CLUSTER_ROUNDS"
fi
