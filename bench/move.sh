#!/usr/bin/env bash
# A partition move on this machine (issue 33): how long a partition of SIZE_MB (default 1024 MiB)
# takes to move to a joining node, and what the rest of the cluster serves meanwhile against
# without the move, in the same run.
#
# Starts 3 nodes on loopback (security off, `server start --dev`, insecure cluster) and creates
# topic `load` (12 partitions, 4 per node) and topic `zbig` (4 partitions: n1 owns 0 and 3), then
# fills partition 3 of `zbig` with SIZE_MB of 16 KiB messages. Phase A: W3 (produce and consume
# at once) on `load` for DURATION seconds through the three nodes. Phase B: a 4th node joins, and
# the same W3 runs at once: the planner moves `zbig` partition 3 (its donor's newest) and three
# `load` partitions to the new node while the load runs. The figures: the move's time and bytes
# (from the new node's log line "partition move ended"), W3's produced/s and acked/s and p99 of
# both phases, and lost = 0 for both.
#
# Usage: bench/move.sh
# Environment: SIZE_MB (default 1024), DURATION (seconds per phase, default 20), NARAD (broker
# binary, default target/release/narad), BUILD=0 to use the binaries in target/release as they
# are, OUT (directory for reports, default a new temporary directory). Loopback only; needs about
# 3 x SIZE_MB of free disk in $TMPDIR.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
SIZE_MB=${SIZE_MB:-1024}
DURATION=${DURATION:-20}
OUT=${OUT:-$(mktemp -d -t narad-move-bench.XXXXXX)}
mkdir -p "$OUT"
[[ "$SIZE_MB" =~ ^[0-9]+$ ]] && [ "$SIZE_MB" -ge 1 ] && [ "$SIZE_MB" -le 8192 ] ||
  { echo "SIZE_MB must be 1..8192" >&2; exit 2; }

# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

if [ "${BUILD:-1}" != 0 ]; then
  echo "== building release binaries"
  cargo build --release --bin narad
  cargo build --release -p narad-bench --bin loadgen
fi
NARAD=${NARAD:-"$ROOT/target/release/narad"}
LOADGEN="$ROOT/target/release/loadgen"

WORK=$(mktemp -d -t narad-move-work.XXXXXX)
PIDS=()
cleanup() {
  stop_pids "${PIDS[@]}"
  PIDS=()
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

APIS=()
CPORTS=()
for i in 1 2 3 4; do
  api=$(free_port $((17700 + 10 * i)))
  APIS+=("$api")
  CPORTS+=("$(free_port $((api + 1)))")
done
PEERS="n1@127.0.0.1:${CPORTS[0]},n2@127.0.0.1:${CPORTS[1]},n3@127.0.0.1:${CPORTS[2]}"
start_node() { # index (1-based)
  local i=$1 extra=()
  mkdir -p "$WORK/n$i"
  [ "$i" -eq 4 ] && extra=(NARAD_CLUSTER_ADVERTISE_ADDR="127.0.0.1:${CPORTS[3]}")
  env -u NARAD_CLUSTER_SECRET NARAD_NODE_ID="n$i" NARAD_CLUSTER_PEERS="$PEERS" \
    NARAD_CLUSTER_ADDR="127.0.0.1:${CPORTS[$((i - 1))]}" "${extra[@]}" \
    NARAD_SECURITY_ALLOW_INSECURE_CLUSTER=true \
    "$NARAD" server start --dev --port "${APIS[$((i - 1))]}" --data-dir "$WORK/n$i" \
    >"$OUT/n$i.log" 2>&1 &
  PIDS+=("$!")
}
for i in 1 2 3; do start_node "$i"; done
for i in 1 2 3; do
  wait_ready "${APIS[$((i - 1))]}" 60 || { echo "node $i not ready" >&2; tail -20 "$OUT/n$i.log" >&2; exit 1; }
done
URL1="http://127.0.0.1:${APIS[0]}"
URLS="$URL1,http://127.0.0.1:${APIS[1]},http://127.0.0.1:${APIS[2]}"

echo "== topics, and $SIZE_MB MiB into zbig/3"
python3 - "$URL1" "$SIZE_MB" <<'PY'
import http.client, json, sys, time, urllib.parse
url, size_mb = sys.argv[1], int(sys.argv[2])
u = urllib.parse.urlparse(url)
c = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
def post(path, body):
    c.request('POST', path, body=body, headers={'Content-Type': 'application/json'})
    r = c.getresponse()
    data = r.read()
    if r.status not in (201, 202):
        sys.exit(f'{path}: {r.status} {data[:200]!r}')
post('/v1/topics', json.dumps({'name': 'load', 'partitions': 12}))
post('/v1/topics', json.dumps({'name': 'zbig', 'partitions': 4}))
owners = None
c.request('GET', '/v1/topics/zbig')
r = c.getresponse()
stats = json.loads(r.read())['partition_stats']
print('zbig owners:', [p.get('owner_node') for p in stats])
pad = 'x' * (16 * 1024 - 40)
msgs_per = 512  # 8 MiB per request
body = json.dumps({'messages': [{'payload': {'i': i, 'pad': pad}, 'partition': 3} for i in range(msgs_per)]})
t0 = time.time()
for _ in range(max(1, size_mb // 8)):
    post('/v1/topics/zbig/produce/batch', body)
print(f'filled in {time.time() - t0:.1f} s')
PY

run_w3() { # label
  local pids
  pids=$(IFS=,; echo "${PIDS[*]}")
  timeout $((DURATION + 300)) "$LOADGEN" load --no-create --url "$URLS" --workload w3 \
    --partitions 12 --duration "$DURATION" --drain-timeout 120 --server-pid "$pids" \
    --json-out "$OUT/$1.json" >"$OUT/$1.txt" 2>&1 ||
    echo "   $1: the generator failed or found lost messages (see $OUT/$1.txt)" >&2
}
echo "== phase A: W3 for $DURATION s, no move"
run_w3 without
echo "== phase B: n4 joins; W3 for $DURATION s during the moves"
start_node 4
run_w3 during
# The moves may outlast the load: wait (bounded) for the big one to end.
for _ in $(seq 1 600); do
  grep -q 'partition move ended topic=zbig partition=3' "$OUT/n4.log" && break
  sleep 1
done
python3 - "$OUT" "$SIZE_MB" <<'PY'
import json, os, re, sys
out, size_mb = sys.argv[1], int(sys.argv[2])
log = open(f'{out}/n4.log').read()
moves = re.findall(r'partition move ended topic=(\S+) partition=(\d+) outcome=(\S+) attempts=(\d+) copied_bytes=(\d+) ms=(\d+)', log)
print(f'reports in {out}')
for t, p, o, a, b, ms in moves:
    mib = int(b) / 2**20
    print(f'move {t}/{p}: {o}, {a} attempt(s), {mib:.1f} MiB in {int(ms) / 1000:.2f} s'
          + (f' ({mib / (int(ms) / 1000):.0f} MiB/s)' if int(ms) else ''))
if not any(t == 'zbig' and p == '3' for t, p, *_ in moves):
    print('move zbig/3: did not end within the wait')
def load(name):
    p = f'{out}/{name}.json'
    return json.load(open(p))['runs'][0] if os.path.exists(p) else None
print(f"{'phase':8} {'produced/s':>11} {'acked/s':>9} {'p99 ms':>7} {'lost':>5}")
for name in ('without', 'during'):
    x = load(name)
    if not x:
        print(f'{name:8} (no report)')
        continue
    lost = sum((x['check'] or {}).get(f, 0) for f in ('lost', 'unexpected', 'acked_twice'))
    print(f"{name:8} {x['produced_per_s']:>11.0f} {x['acked_per_s']:>9.0f} {x['latency']['p99_us'] / 1000:>7.2f} {lost:>5}")
PY
