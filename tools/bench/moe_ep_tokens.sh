#!/bin/bash
# Tokens/s of a MoE Llama at ep 1, 2 and 4 on 4 CPU ranks (dp_shard 4; issue 35's figure): 4 layers
# of width 256, every layer 8 experts of 256 with top-2, batch 8 x 256, median of steps 2-7,
# interleaved rounds. The all-to-all share: add --profile-ops to a run and read its
# ep::all_to_all rows against "(self times summed)".
#   bazel build -c opt //examples:loom_train //tools/loomrun && tools/bench/moe_ep_tokens.sh [rounds]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
B=$root/bazel-bin/examples/loom_train
L=$root/bazel-bin/tools/loomrun/loomrun
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() {  # EP -> median tokens/s
  "$B" --launcher "$L" --model llama-moe-tiny --n-embd 256 --n-head 8 --n-kv-heads 8 --n-layer 4 \
    --moe-experts 8 --moe-top-k 2 --moe-hidden-dim 256 --moe-dense-layers 0 --block-size 256 \
    --vocab-size 256 --tp 1 --dp 1 --dp-shard 4 --ep "$1" --nproc 4 --seq-len 256 --batch-size 8 \
    --steps 8 --sample-tokens 0 --no-progress --plot-out "" --metrics-out "$work/m.jsonl" \
    > "$work/log" 2>&1 || { tail -3 "$work/log"; return; }
  grep -o '"tokens_per_s":[0-9.]*' "$work/m.jsonl" | cut -d: -f2 | tail -n +3 | sort -n |
    awk '{a[NR]=$1} END {printf "%.0f", a[int((NR+1)/2)]}'
}
for r in $(seq 1 "${1:-3}"); do
  echo "round $r: ep1 $(run 1) tok/s | ep2 $(run 2) tok/s | ep4 $(run 4) tok/s"
done
