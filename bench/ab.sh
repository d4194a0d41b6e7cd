#!/usr/bin/env bash
# A/B benchmark of two narad builds on this machine, in one run: the same generator and the same
# nginx ceiling, the two brokers alternating (A, B, A, B, ...) so that the machine's drift hits
# both alike. Each round runs the generator's `--workload all` (ceiling, W1, W2, W3 with its loss
# check, W4@10k, W4 at half of W1) against a fresh broker on a fresh data directory.
#
# Usage: bench/ab.sh A_BINARY B_BINARY [ROUNDS]     (default 3 rounds)
#   e.g. build the baseline in a worktree:
#     git worktree add --detach /tmp/base <rev> && (cd /tmp/base && cargo build --release --bin narad)
#     cargo build --release --bin narad -p narad && cargo build --release -p narad-bench --bin loadgen
#     bench/ab.sh /tmp/base/target/release/narad target/release/narad 5
# Environment: DURATION (seconds per workload, default 5), OUT (directory for the per-run text and
# JSON reports, default a new temporary directory). Needs nginx (bench/run.sh installs it).
# Prints, per workload, each run's msg/s and the median ratio B/A, and the median p99s.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
A=$(realpath "$1")
B=$(realpath "$2")
ROUNDS=${3:-3}
DURATION=${DURATION:-5}
LOADGEN="$ROOT/target/release/loadgen"
[ -x "$LOADGEN" ] || { echo "build the generator first: cargo build --release -p narad-bench --bin loadgen" >&2; exit 2; }
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[ -x "$NGINX" ] || { echo "nginx is missing (bench/run.sh installs it)" >&2; exit 2; }
OUT=${OUT:-$(mktemp -d -t narad-ab.XXXXXX)}
mkdir -p "$OUT"
WORK=$(mktemp -d -t narad-ab-work.XXXXXX)

# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
NGINX_PORT=$(free_port 18280)
BROKER_PORT=$(free_port 17980)
write_nginx_conf "$WORK" "$NGINX_PORT"
BROKER_PID=""
cleanup() {
  [ -n "$BROKER_PID" ] && kill "$BROKER_PID" 2>/dev/null || true
  [ -f "$WORK/nginx.pid" ] && "$NGINX" -c "$WORK/nginx.conf" -p "$WORK" -s stop 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM
"$NGINX" -c "$WORK/nginx.conf" -p "$WORK" -e "$WORK/logs/error.log"
wait_port "$NGINX_PORT" 10
NGINX_PID=$(cat "$WORK/nginx.pid")

run() { # name binary
  local data
  data=$(mktemp -d -t narad-ab-data.XXXXXX)
  "$2" server start --dev --port "$BROKER_PORT" --data-dir "$data" >"$OUT/$1.log" 2>&1 &
  BROKER_PID=$!
  wait_port "$BROKER_PORT" 60 || echo "$1: the broker did not open its port" >&2
  timeout $((DURATION * 12 + 120)) "$LOADGEN" bench --url "http://127.0.0.1:$BROKER_PORT" \
    --workload all --ceiling-url "http://127.0.0.1:$NGINX_PORT" --ceiling-pid "$NGINX_PID" \
    --server-pid "$BROKER_PID" --duration "$DURATION" --json-out "$OUT/$1.json" >"$OUT/$1.txt" 2>&1 ||
    echo "$1: the generator failed (see $OUT/$1.txt)" >&2
  kill "$BROKER_PID" 2>/dev/null || true
  wait "$BROKER_PID" 2>/dev/null || true
  BROKER_PID=""
  rm -rf "$data"
}
names=()
for r in $(seq "$ROUNDS"); do
  echo "== round $r of $ROUNDS"
  run "a$r" "$A"
  run "b$r" "$B"
  names+=("a$r" "b$r")
done
python3 - "$OUT" "${names[@]}" <<'PY'
import re, statistics, sys
out, names = sys.argv[1], sys.argv[2:]
row = re.compile(r'^(ceiling W1|W1|W2|W3|W4@\d+k)\s+\S+\s+\d+\s+\S+\s+([\d,]+)\s+\S+\s+[\d,]+\s+\S+\s+\S+\s+(\S+)')
def ms(s):
    return float(s[:-2]) if s.endswith('ms') else float(s[:-2]) / 1000 if s.endswith('us') else float(s[:-1]) * 1000
res = {}
for n in names:
    for line in open(f'{out}/{n}.txt'):
        m = row.match(line)
        if m:
            w = m.group(1)
            w = w if w in ('ceiling W1', 'W1', 'W2', 'W3', 'W4@10k') else 'W4@half'
            res.setdefault(w, {})[n] = (int(m.group(2).replace(',', '')), ms(m.group(3)))
print(f'reports in {out}')
print(f"{'workload':10} {'A msg/s':>40} {'B msg/s':>40}  B/A   p99 A / B (median)")
for w, v in res.items():
    a = [v[n] for n in names if n[0] == 'a' and n in v]
    b = [v[n] for n in names if n[0] == 'b' and n in v]
    if not a or not b:
        continue
    ra = statistics.median(x[0] for x in a)
    rb = statistics.median(x[0] for x in b)
    print(f"{w:10} {str([x[0] for x in a]):>40} {str([x[0] for x in b]):>40}  {rb / ra:.3f}"
          f"  {statistics.median(x[1] for x in a):.2f} / {statistics.median(x[1] for x in b):.2f} ms")
PY
grep -h 'W3 check' "$OUT"/*.txt | sed 's/^/  /'
