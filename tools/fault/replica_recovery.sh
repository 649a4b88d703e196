#!/usr/bin/env bash
# Issue 37's live-rejoin figures: two replica jobs (tp1 each) over a lighthouse; replica 1 is
# killed after step 4 and started again after replica 0's step 8. Prints, per run: the survivor's
# slowest step after the kill (the step that notices the loss: a failed average or the join
# window, then a new group), and the time from the replacement's start to its first completed step
# (build, join, receive the state, one step). For `tiny` and `small`.
#   bazel build -c opt //examples:loom_train //tools/loomrun //tools/lighthouse &&
#   tools/fault/replica_recovery.sh [runs]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
B=$root/bazel-bin/examples/loom_train
L=$root/bazel-bin/tools/loomrun/loomrun
H=$root/bazel-bin/tools/lighthouse/lighthouse
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
progress() { cat "$1" 2>/dev/null || echo -1; }
wait_step() { while ! [[ $(progress "$1") =~ ^[0-9]+$ && $(progress "$1") -ge $2 ]]; do sleep 0.005; done; }
now() { date +%s.%N; }
run() {  # run MODEL STEPS
  local dir="$work/$1_$RANDOM"
  mkdir -p "$dir/r0" "$dir/r1" "$dir/back" && cd "$dir"
  "$H" --port 0 --bind 127.0.0.1 >lh.log 2>&1 &
  local lh=$! port=""
  while [[ -z $port ]]; do port=$(sed -n 's/.*127.0.0.1:\([0-9]*\)$/\1/p' lh.log); sleep 0.01; done
  local common=(--launcher "$L" --model "$1" --dp 1 --tp 1 --steps "$2" --batch-size 4
    --seq-len 64 --replicas 2 --replica-store "127.0.0.1:$port" --replica-join-window-ms 300
    --sample-tokens 0 --no-progress --plot-out "" --log-every 1)
  (LOOM_PROGRESS_FILE="$dir/r0/p" exec "$B" "${common[@]}" --replica 0 --metrics-out r0/m.jsonl >r0/log 2>&1) &
  local r0=$!
  (LOOM_PROGRESS_FILE="$dir/r1/p" exec "$B" "${common[@]}" --replica 1 --metrics-out "" >r1/log 2>&1) &
  local r1=$!
  wait_step r0/p 4
  kill -9 "$r1"
  wait_step r0/p 8
  local started
  started=$(now)
  (LOOM_PROGRESS_FILE="$dir/back/p" exec "$B" "${common[@]}" --replica 1 --metrics-out "" >back/log 2>&1) &
  local back=$!
  while [[ ! -s back/p ]]; do sleep 0.005; done
  local rejoin
  rejoin=$(awk -v a="$started" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }')
  wait "$r0" "$back" || true
  kill "$lh" 2>/dev/null || true
  local stall
  stall=$(sed -n 's/.*"ms_per_step":\([0-9.]*\).*"step":\([0-9]*\).*/\2 \1/p' r0/m.jsonl |
    awk '$1 >= 4 && $1 <= 8 { if ($2 > m) m = $2 } END { printf "%.0f", m }')
  echo "$1: survivor's slowest step after the kill ${stall} ms; replacement's start to its first step ${rejoin} s"
  cd "$work"
}
for i in $(seq 1 "${1:-3}"); do run tiny 30; done
run small 14
