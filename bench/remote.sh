#!/usr/bin/env bash
# Remote children on this machine (issue 34): records per second shipped to a loopback target
# broker, and the parent's produce rate while it ships against without a remote child, same run.
#
# Starts two brokers with security on (one shard each on this 2-core machine's cores), a
# TLS-terminating relay (python3's ssl module, a throw-away CA from the openssl CLI) in front of
# the target, registers the target on the parent and creates topic `orders` (3 partitions) on
# both sides. Phase A: W2 (batch produce, 100 x 256-byte records per request) to the parent's
# `orders` for DURATION seconds with no remote child. Then a remote child `orders-to-b` is attached
# (from `attach`) and phase B runs the same W2 while it ships. The figures: W2's produced/s in both
# phases, and the shipped records per second (records produced in phase B over the time from its
# start until the child's lag is 0).
#
# Usage: bench/remote.sh
# Environment: DURATION (seconds per phase, default 15), LANES (the child's lanes, default 1),
# COMPRESSION (the remote's `limits.compression`, none or zstd; default none), NARAD (broker binary, default
# target/release/narad), BUILD=0 to use it as it is, OUT (directory for logs, default a new
# temporary directory). Loopback only.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
DURATION=${DURATION:-15}
LANES=${LANES:-1}
COMPRESSION=${COMPRESSION:-none}
OUT=${OUT:-$(mktemp -d -t narad-remote-bench.XXXXXX)}
mkdir -p "$OUT"
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

if [ "${BUILD:-1}" != 0 ]; then
  echo "== building the release binary"
  cargo build --release --bin narad
fi
NARAD=${NARAD:-"$ROOT/target/release/narad"}
PW=bench-root-password
REPL_PW=bench-replicator-password-0123
SECRET=bench-cluster-secret-0123456789

WORK=$(mktemp -d -t narad-remote-work.XXXXXX)
PIDS=()
cleanup() {
  stop_pids "${PIDS[@]}"
  PIDS=()
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

echo "== certificates"
(
  cd "$WORK"
  printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >leaf.ext
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.pem \
    -days 2 -subj "/CN=narad bench CA" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout leaf.key -out leaf.csr \
    -subj "/CN=narad bench target" 2>/dev/null
  openssl x509 -req -in leaf.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out leaf.pem -days 2 \
    -extfile leaf.ext 2>/dev/null
)

TPORT=$(free_port 18710)
PPORT=$(free_port $((TPORT + 2)))
FPORT=$(free_port $((PPORT + 2)))
env NARAD_ADMIN_PASSWORD="$PW" NARAD_LOG_LEVEL=warn NARAD_SHARDS=1 \
  NARAD_CLUSTER_ADDR="127.0.0.1:$((TPORT + 1))" \
  "$NARAD" server start --port "$TPORT" --data-dir "$WORK/target" >"$OUT/target.log" 2>&1 &
PIDS+=("$!")
TPID=$!
env NARAD_ADMIN_PASSWORD="$PW" NARAD_LOG_LEVEL=warn NARAD_SHARDS=1 NARAD_CLUSTER_SECRET="$SECRET" \
  NARAD_CLUSTER_ADDR="127.0.0.1:$((PPORT + 1))" \
  NARAD_REMOTES_API_HOP_ENCRYPTED=true NARAD_REMOTES_ALLOWED_PORTS="$FPORT" \
  NARAD_REMOTES_ALLOW_ADDRESSES=127.0.0.1/32 \
  "$NARAD" server start --port "$PPORT" --data-dir "$WORK/parent" >"$OUT/parent.log" 2>&1 &
PIDS+=("$!")
PPID_=$!
python3 - "$WORK/leaf.pem" "$WORK/leaf.key" "$FPORT" "$TPORT" >"$OUT/front.log" 2>&1 <<'PY' &
import asyncio, ssl, sys
cert, key, port, upstream = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
async def pipe(r, w):
    try:
        while data := await r.read(1 << 16):
            w.write(data)
            await w.drain()
    except Exception:
        pass
    finally:
        w.close()
async def serve(cr, cw):
    ur, uw = await asyncio.open_connection('127.0.0.1', upstream)
    await asyncio.gather(pipe(cr, uw), pipe(ur, cw))
async def main():
    s = await asyncio.start_server(serve, '127.0.0.1', port, ssl=ctx)
    async with s:
        await s.serve_forever()
asyncio.run(main())
PY
PIDS+=("$!")
FRONT_PID=$!
cpu_s() { # pid: CPU seconds used so far (user + system)
  awk -v t="$(getconf CLK_TCK)" '{print ($14 + $15) / t}' "/proc/$1/stat"
}
for p in "$TPORT" "$PPORT"; do
  wait_ready "$p" 60 || { echo "broker on $p not ready" >&2; tail -20 "$OUT"/*.log >&2; exit 1; }
done
wait_port "$FPORT" 10 || { echo "the TLS front did not start" >&2; cat "$OUT/front.log" >&2; exit 1; }

api() { # port method path [body]
  curl -s -u "admin:$PW" -X "$2" -H 'Content-Type: application/json' \
    "http://127.0.0.1:$1$3" ${4:+-d "$4"}
}
api "$TPORT" POST /v1/topics '{"name":"orders","partitions":3}' >/dev/null
api "$TPORT" POST /v1/users \
  "{\"username\":\"replicator\",\"password\":\"$REPL_PW\",\"grants\":[{\"action\":\"produce\",\"patterns\":[\"orders\"]}]}" >/dev/null
api "$PPORT" POST /v1/topics '{"name":"orders","partitions":3}' >/dev/null
CA=$(python3 -c 'import json,sys; print(json.dumps(open(sys.argv[1]).read()))' "$WORK/ca.pem")
api "$PPORT" POST /v1/remotes \
  "{\"name\":\"b\",\"url\":\"https://127.0.0.1:$FPORT\",\"username\":\"replicator\",\"password\":\"$REPL_PW\",\"ca_pem\":$CA,\"limits\":{\"compression\":\"$COMPRESSION\"}}" >"$OUT/register.json"
grep -q '"credential_version"' "$OUT/register.json" || { cat "$OUT/register.json" >&2; exit 1; }

w2() { # label
  NARAD_USER=admin NARAD_PASS="$PW" timeout $((DURATION + 120)) "$NARAD" bench \
    --url "http://127.0.0.1:$PPORT" --no-create --workload w2 --size 256 \
    --duration "$DURATION" --server-pid "$PPID_,$TPID" --json-out "$OUT/$1.json" orders >"$OUT/$1.txt" 2>&1 ||
    { echo "   $1: the generator failed (see $OUT/$1.txt)" >&2; }
}
hwm() { # port topic: the sum of the partitions' high watermarks
  api "$1" GET "/v1/topics/$2" | python3 -c 'import json,sys; print(sum(p["high_watermark"] for p in json.load(sys.stdin)["partition_stats"]))'
}

echo "== phase A: W2 for $DURATION s, no remote child"
w2 without
api "$PPORT" POST /v1/topics/orders/children \
  '{"child":"orders-to-b","remote":"b","remote_topic":"orders","lanes":'"$LANES"'}' >"$OUT/attach.json"
grep -q '"remote"' "$OUT/attach.json" || { cat "$OUT/attach.json" >&2; exit 1; }
BEFORE=$(hwm "$PPORT" orders)
echo "== phase B: W2 for $DURATION s while shipping"
T0=$(date +%s.%N)
FRONT0=$(cpu_s "$FRONT_PID")
w2 during
AFTER=$(hwm "$PPORT" orders)
LAG=-1
for _ in $(seq 1 600); do
  LAG=$(api "$PPORT" GET /v1/topics/orders/children |
    python3 -c 'import json,sys; c=json.load(sys.stdin)["children"][0]; print(c["lag_messages"] if c["lag_complete"] else -1)')
  [ "$LAG" = 0 ] && break
  sleep 0.5
done
T1=$(date +%s.%N)
FRONT_CPU=$(awk -v a="$FRONT0" -v b="$(cpu_s "$FRONT_PID")" 'BEGIN {print b - a}')
ON_TARGET=$(hwm "$TPORT" orders)
python3 - "$OUT" "$BEFORE" "$AFTER" "$T0" "$T1" "$LAG" "$ON_TARGET" "$FRONT_CPU" <<'PY'
import json, os, sys
out, before, after, t0, t1, lag, on_target = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
front_cpu = float(sys.argv[8])
def load(name):
    p = f'{out}/{name}.json'
    return json.load(open(p))['runs'][0] if os.path.exists(p) else None
print(f'reports in {out}')
print(f"{'phase':8} {'produced/s':>11} {'p99 ms':>7}  CPU s (parent, target)")
for name in ('without', 'during'):
    x = load(name)
    if x:
        cpus = ', '.join(f"{s['cpu_s']:.1f}" for s in x.get('servers', []))
        print(f"{name:8} {x['produced_per_s']:>11.0f} {x['latency']['p99_us'] / 1000:>7.2f}  {cpus}")
print(f'TLS front (python) CPU during phase B and the catch-up: {front_cpu:.1f} s')
a, b = load('without'), load('during')
if a and b and a['produced_per_s']:
    print(f"produce while shipping / without: {b['produced_per_s'] / a['produced_per_s']:.2f}x")
shipped = after - before
if lag == 0:
    print(f'shipped {shipped} records of phase B in {t1 - t0:.1f} s: {shipped / (t1 - t0):.0f} records/s '
          f'(target holds {on_target}, duplicates included)')
else:
    print(f'the child still lagged {lag} records after the wait')
PY
