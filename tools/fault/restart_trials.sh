#!/usr/bin/env bash
# Issue 37's restart figures: (1) 20 trials of loom_train_restart_test (a random rank killed at a
# random step of a dp2 job with --max-restarts 3; each must finish with losses bitwise the
# uninterrupted run's); (2) the recovery time from the kill to the restarted job's next completed
# step, for `tiny` and `small` (dp2, checkpoint every 2 steps), median of 3.
#   bazel build -c opt //examples:loom_train //tools/loomrun && tools/fault/restart_trials.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
B=$root/bazel-bin/examples/loom_train
L=$root/bazel-bin/tools/loomrun/loomrun
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

(cd "$work" && TEST_TMPDIR="$work/trials" mkdir -p "$work/trials" &&
  TEST_TMPDIR="$work/trials" bash "$root/tests/examples/loom_train_restart_test.sh" "$B" "$L" 20) |
  grep -c "^ok: trial" | sed 's/^/trials passed: /'

now() { date +%s.%N; }
recovery() {  # recovery MODEL STEPS KILL_AFTER -> seconds from the kill to the next completed step
  local dir="$work/rec_$1_$RANDOM"
  mkdir -p "$dir"
  LOOM_FLIGHT_RECORDER_DIR="$dir/flight" "$B" --launcher "$L" --model "$1" --dp 2 --tp 1 \
    --steps "$2" --batch-size 4 --seq-len 64 --checkpoint-dir "$dir/ck" --checkpoint-every 2 \
    --max-restarts 2 --sample-tokens 0 --no-progress --plot-out "" --metrics-out "" >"$dir/log" 2>&1 &
  local job=$! killed_at=""
  while kill -0 "$job" 2>/dev/null; do
    local s
    s=$(cat "$dir/flight/progress" 2>/dev/null || echo -1)
    if [[ -z $killed_at && $s =~ ^[0-9]+$ ]] && (( s >= $3 )); then
      kill -9 "$(pgrep -P "$job" | sort -n | tail -1)"
      killed_at=$(now)
    fi
    if [[ -n $killed_at ]] && grep -q "resumed from" "$dir/log" &&
      [[ $(stat -c %Y.%N "$dir/flight/progress" 2>/dev/null | cut -d. -f1) -ge ${killed_at%.*} ]] &&
      (( $(stat -c %s "$dir/flight/progress") > 0 )) &&
      [[ $(find "$dir/flight/progress" -newermt "@$killed_at" 2>/dev/null) ]]; then
      awk -v a="$killed_at" -v b="$(now)" 'BEGIN { printf "%.2f\n", b - a }'
      wait "$job" || true
      return
    fi
    sleep 0.02
  done
  echo "no recovery (see $dir/log)"
}
for model in tiny small; do
  steps=12 after=5
  [[ $model == small ]] && steps=8 after=3
  times=$(for i in 1 2 3; do recovery "$model" "$steps" "$after"; done | sort -n | tr '\n' ' ')
  echo "recovery, restart from checkpoint, $model (dp2): $times s (sorted; median the middle)"
done
