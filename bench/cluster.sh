#!/usr/bin/env bash
# One node against a 3-node loopback cluster, interleaved in one run (issue 31): what the extra
# hop between nodes costs.
#
# Each round starts the two setups one after the other (alternating which goes first), each on
# fresh data directories, and runs W1, W2, W3 and W4 at RATE msg/s against it, one generator run
# per workload. Against the cluster the generator spreads its connections round-robin over the
# three nodes (`--url a,b,c`, as a load balancer would). W1, W2 and W4 drain their topic after
# producing (`--consume`) and W3 consumes while producing, so every workload ends with the
# check: lost = accepted messages never acked (must be 0). For every node the generator reports
# CPU seconds and bytes written to storage inside the measurement window (/proc/<pid>/stat and
# /proc/<pid>/io); the summary gives cores, CPU microseconds per message and bytes written per
# message, and the 3-node/1-node ratios.
#
# Usage: bench/cluster.sh [ROUNDS]                  (default 3 rounds; ~3 min each at DURATION=5)
# Environment: DURATION (seconds per workload, default 5), RATE (W4 msg/s, default 5000),
# PARTITIONS (per topic, default 12: a multiple of 3 nodes x 2 shards), NARAD_SHARDS (shards per
# node, both setups; default one per CPU), CLUSTER_SHARDS (shards per node of the 3-node cluster
# only, default NARAD_SHARDS), NARAD (the broker binary, default target/release/narad; an A/B
# runs this script once per build with BUILD=0), OUT (directory for the per-run reports, default a new
# temporary directory), BUILD=0 to use the binaries in target/release as they are, REPORT_ONLY=1
# (with OUT and ROUNDS of an earlier run) to print that run's summary again.
# Both setups run with security off (`server start --dev`); the cluster additionally with
# NARAD_SECURITY_ALLOW_INSECURE_CLUSTER=true and no secret. Loopback only.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
ROUNDS=${1:-3}
DURATION=${DURATION:-5}
RATE=${RATE:-5000}
PARTITIONS=${PARTITIONS:-12}
DRAIN=120
OUT=${OUT:-$(mktemp -d -t narad-cluster-bench.XXXXXX)}
mkdir -p "$OUT"
[[ "$ROUNDS" =~ ^[0-9]+$ ]] && [ "$ROUNDS" -ge 1 ] && [ "$ROUNDS" -le 20 ] ||
  { echo "ROUNDS must be 1..20" >&2; exit 2; }

# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

REPORT_ONLY=${REPORT_ONLY:-0}
if [ "$REPORT_ONLY" = 0 ] && [ "${BUILD:-1}" != 0 ]; then
  echo "== building release binaries"
  cargo build --release --bin narad
  cargo build --release -p narad-bench --bin loadgen
fi
NARAD=${NARAD:-"$ROOT/target/release/narad"}
LOADGEN="$ROOT/target/release/loadgen"

WORK=$(mktemp -d -t narad-cluster-work.XXXXXX)
PIDS=()
cleanup() {
  stop_pids "${PIDS[@]}"
  PIDS=()
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

PORTS=() # API ports of the running setup
start_setup() { # name nodes: starts the nodes, fills PIDS and PORTS
  local name=$1 n=$2 i peers="" api cport
  local -a apis=() cports=()
  PIDS=()
  PORTS=()
  for ((i = 1; i <= n; i++)); do
    api=$(free_port $((17600 + 10 * i)))
    cport=$(free_port $((api + 1)))
    apis+=("$api")
    cports+=("$cport")
    peers+="${peers:+,}n$i@127.0.0.1:$cport"
  done
  for ((i = 1; i <= n; i++)); do
    api=${apis[$((i - 1))]}
    mkdir -p "$WORK/$name-n$i"
    if [ "$n" -eq 1 ]; then
      env -u NARAD_CLUSTER_PEERS -u NARAD_CLUSTER_SECRET -u NARAD_NODE_ID \
        "$NARAD" server start --dev --port "$api" --data-dir "$WORK/$name-n$i" \
        >"$OUT/$name-n$i.log" 2>&1 &
    else
      env -u NARAD_CLUSTER_SECRET ${CLUSTER_SHARDS:+NARAD_SHARDS=$CLUSTER_SHARDS} \
        NARAD_NODE_ID="n$i" NARAD_CLUSTER_PEERS="$peers" \
        NARAD_CLUSTER_ADDR="127.0.0.1:${cports[$((i - 1))]}" \
        NARAD_SECURITY_ALLOW_INSECURE_CLUSTER=true \
        "$NARAD" server start --dev --port "$api" --data-dir "$WORK/$name-n$i" \
        >"$OUT/$name-n$i.log" 2>&1 &
    fi
    PIDS+=("$!")
    PORTS+=("$api")
  done
  for ((i = 1; i <= n; i++)); do
    wait_ready "${PORTS[$((i - 1))]}" 60 ||
      { echo "$name: node $i not ready" >&2; tail -20 "$OUT/$name-n$i.log" >&2; return 1; }
  done
}

run_setup() { # label nodes round
  local label=$1 n=$2 r=$3 urls="" pids w args p
  start_setup "$label$r" "$n"
  for p in "${PORTS[@]}"; do urls+="${urls:+,}http://127.0.0.1:$p"; done
  pids=$(IFS=,; echo "${PIDS[*]}")
  for w in w1 w2 w3 w4; do
    args=(--workload "$w")
    case $w in
      w3) ;;
      w4) args+=(--rate "$RATE" --consume) ;;
      *) args+=(--consume) ;;
    esac
    echo "   $label round $r: $w"
    timeout $((DURATION + DRAIN + 120)) "$LOADGEN" "c$r-$label-$w" --url "$urls" "${args[@]}" \
      --partitions "$PARTITIONS" --duration "$DURATION" --drain-timeout "$DRAIN" \
      --server-pid "$pids" --json-out "$OUT/$label$r-$w.json" >"$OUT/$label$r-$w.txt" 2>&1 ||
      echo "   $label round $r $w: the generator failed or found lost messages (see $OUT/$label$r-$w.txt)" >&2
  done
  stop_pids "${PIDS[@]}"
  PIDS=()
  rm -rf "$WORK/$label$r"-n*
}

[ "$REPORT_ONLY" = 0 ] &&
  echo "== $ROUNDS rounds, $DURATION s per workload, W4 at $RATE msg/s, $PARTITIONS partitions, shards per node: one ${NARAD_SHARDS:-default}, three ${CLUSTER_SHARDS:-${NARAD_SHARDS:-default}}; reports in $OUT"
for ((r = 1; r <= ROUNDS && REPORT_ONLY == 0; r++)); do
  echo "== round $r of $ROUNDS"
  if ((r % 2)); then
    run_setup one 1 "$r"
    run_setup three 3 "$r"
  else
    run_setup three 3 "$r"
    run_setup one 1 "$r"
  fi
done

python3 - "$OUT" "$ROUNDS" "$RATE" <<'PY'
import json, os, statistics, sys
out, rounds, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
W = ['w1', 'w2', 'w3', 'w4']
def load(label, r, w):
    p = f'{out}/{label}{r}-{w}.json'
    if not os.path.exists(p):
        return None
    runs = json.load(open(p))['runs']
    return runs[0] if runs else None
res = {(s, w): [x for x in (load(s, r, w) for r in range(1, rounds + 1)) if x] for s in ('one', 'three') for w in W}
def rate_of(x):  # the workload's headline: acked/s for W3, produced/s otherwise
    return x['acked_per_s'] if x['workload'].startswith('W3') else x['produced_per_s']
def med(v):
    return statistics.median(v) if v else float('nan')
def k(v):
    return f'{v / 1000:.0f}k' if v >= 10000 else f'{v / 1000:.1f}k'
print(f'reports in {out}')
print(f"{'':8} {'setup':6} {'msg/s per round':>30} {'median':>7} {'3/1':>5} {'p99 med':>8} {'cores/node (median)':>22} {'cpu us/msg':>10} {'B/msg':>6} {'lost':>5} {'errors':>6}")
for w in W:
    base = None
    for s in ('one', 'three'):
        xs = res[(s, w)]
        if not xs:
            print(f'{w.upper():8} {s:6} (no report)')
            continue
        rates = [rate_of(x) for x in xs]
        m = med(rates)
        ratio = '' if s == 'one' or not base else f'{m / base:.2f}'
        if s == 'one':
            base = m
        nodes = len(xs[0]['servers'])
        cores = [med([x['servers'][i]['cpu_s'] / x['window_s'] for x in xs if x['window_s'] > 0]) for i in range(nodes)]
        us = med([1e6 * x['server_cpu_s'] / x['produced'] for x in xs if x['produced']])
        bpm = med([x['server_write_bytes_per_msg'] for x in xs if x['server_write_bytes_per_msg'] is not None])
        lost = sum(sum((x['check'] or {}).get(f, 0) for f in ('lost', 'unexpected', 'acked_twice')) for x in xs)
        nochk = sum(1 for x in xs if not x['check'])
        errs = sum(x['error_count'] for x in xs)
        p99 = med([x['latency']['p99_us'] / 1000 for x in xs])
        name = xs[0]['workload']
        print(f"{name:8} {s:6} {' '.join(k(v) for v in rates):>30} {k(m):>7} {ratio:>5} {p99:>6.2f}ms "
              f"{' '.join(f'{c:.2f}' for c in cores):>22} {us:>10.1f} {bpm:>6.0f} {lost:>5}{'?' if nochk else ''} {errs:>6}")
for s in ('one', 'three'):
    xs = res[(s, 'w4')]
    if xs:
        print(f"{xs[0]['workload']} {s:5} per round: p50 " + ' '.join(f"{x['latency']['p50_us'] / 1000:.2f}" for x in xs)
              + ' ms, p99 ' + ' '.join(f"{x['latency']['p99_us'] / 1000:.2f}" for x in xs) + ' ms')
print('msg/s: acked/s for W3, produced/s otherwise (window after warm-up); 3/1: median 3-node / median 1-node;')
print('cores/node: CPU seconds / window per node; cpu us/msg: all nodes\' CPU per message produced; B/msg: bytes')
print('written to storage by all nodes per message produced (window); lost: accepted never acked, all rounds')
PY
