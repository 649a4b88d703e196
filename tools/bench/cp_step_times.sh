#!/bin/bash
# Step time of the context-parallel attention variants side by side on CPU ranks (issue 34's
# figure): a 2-layer dim-256 Llama, T 2048, batch 2, cp 1, 2 and 4, median of steps 2-9 of each
# run, interleaved rounds. On a 2-core machine cp 4 is 4 ranks on 2 cores.
#   bazel build -c opt //examples:loom_train //tools/loomrun && tools/bench/cp_step_times.sh [rounds]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
B=$root/bazel-bin/examples/loom_train
L=$root/bazel-bin/tools/loomrun/loomrun
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() {  # CP VARIANT -> median ms of steps 2..9
  "$B" --launcher "$L" --model llama-tiny --n-embd 256 --n-head 8 --n-kv-heads 8 --n-layer 2 \
    --block-size 2048 --vocab-size 256 --dp 1 --tp 1 --cp "$1" --cp-attention "$2" --seq-len 2048 \
    --batch-size 2 --steps 10 --sample-tokens 0 --no-progress --plot-out "" \
    --metrics-out "$work/m.jsonl" > "$work/log" 2>&1 || { tail -3 "$work/log"; return; }
  grep -o '"ms_per_step":[0-9.]*' "$work/m.jsonl" | cut -d: -f2 | tail -n +3 | sort -n |
    awk '{a[NR]=$1} END {printf "%.1f", a[int((NR+1)/2)]}'
}
for r in $(seq 1 "${1:-3}"); do
  for cp in 2 4; do
    echo "round $r cp $cp: allgather $(run $cp allgather) ms | ring $(run $cp ring) ms | alltoall $(run $cp alltoall) ms"
  done
  echo "round $r cp 1: $(run 1 allgather) ms"
done
