#!/usr/bin/env bash
# Replays the fault-harness rounds that once found a bug (issue 32: "every failure it found
# fixed in the broker and its seed kept as a regression round"), each as it was first run.
# Netns rounds need root (the harness says why and runs them on loopback without the cuts
# otherwise). Usage: tests/harness/regressions.sh [narad binary]   (default target/debug/narad)
# Exit status: 0 when every round passed, else the first failing round's.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=${1:-$ROOT/target/debug/narad}
H=(python3 "$ROOT/tests/harness/harness.py" --binary "$BIN" --rounds 1)
status=0
run() { # why, then the round's arguments
  local why=$1
  shift
  echo "== $why: $*"
  "${H[@]}" "$@" || { rc=$?; [ "$status" = 0 ] && status=$rc; }
}
run "finding 1 (a cut-off node answered a delete 404 from stale metadata)" \
  --nodes 3 --seed 1 --duration 16 --netns on --faults partition --partition-shapes isolate --partition-s 8
run "findings 2 and 4 (copies after a cut; a majority without a leader after a heal)" \
  --nodes 3 --seed 60 --duration 40 --faults partition,kill
run "finding 3 (a drain stalled on one partition after a cut)" \
  --nodes 3 --seed 41 --duration 40 --faults partition,kill
run "finding 5 (a forwarded proposal delivered after the cut healed: a delete)" \
  --nodes 3 --seed 1005 --duration 20
run "finding 5 (the same with a create)" \
  --nodes 3 --seed 1034 --duration 20
run "finding 6 (a hand-off held for its 30 s deadline on a silent path)" \
  --nodes 3 --seed 1013 --duration 20
run "the vote file on a full disk (raft/tests/vote_disk_full.rs)" \
  --nodes 3 --seed 10 --duration 20
exit $status
