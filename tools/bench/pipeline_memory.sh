#!/bin/bash
# Peak tensor memory per pipeline rank under each schedule (issue 36's figure), from `loom plan`
# (its traced step's "peak in step") and from a real run (the job's "tensor peak per rank" line)
# side by side: an 8-layer tiny GPT over pp 4, 8 microbatches, 3 steps on CPU ranks.
#   bazel build -c opt //examples:loom_train //tools/loomrun && tools/bench/pipeline_memory.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
B=$root/bazel-bin/examples/loom_train
L=$root/bazel-bin/tools/loomrun/loomrun
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--pp 4 --dp 1 --tp 1 --n-layer 8 --microbatches 8 --batch-size 16)
echo "| schedule | plan: peak in step per pp rank (MiB) | run: tensor peak per rank (MiB) | plan: peak microbatches held |"
echo "|---|---|---|---|"
for schedule in gpipe 1f1b zb-h1 interleaved zbv dualpipev; do
  extra=()
  [[ $schedule == interleaved ]] && extra=(--virtual-stages 2)
  "$B" --launcher "$L" --plan "${common[@]}" --schedule "$schedule" "${extra[@]}" > "$work/plan" 2>&1 ||
    { tail -3 "$work/plan"; exit 1; }
  # The traced table's rows name rank ranges ("1-2"): one figure per rank, in rank order.
  plan=$(sed -n '/^Traced step/,/^Communication/p' "$work/plan" | awk -F'|' '
    $2 ~ /^ *[0-9]/ {
      n = split($2, parts, ",")
      for (i = 1; i <= n; ++i) {
        gsub(/ /, "", parts[i]); split(parts[i], ends, "-"); last = ends[2] == "" ? ends[1] : ends[2]
        for (r = ends[1]; r <= last; ++r) peak[r] = $5 + 0
      }
    }
    END { for (r = 0; r < 4; ++r) printf "%s%.1f", (r ? ", " : ""), peak[r] }')
  held=$(sed -n '/^| pp rank/,/^$/p' "$work/plan" | awk -F'|' '$2 ~ /^ *[0-9]/ { printf "%s%d", (n++ ? ", " : ""), $4 }')
  "$B" --launcher "$L" "${common[@]}" --schedule "$schedule" "${extra[@]}" --steps 3 \
    --sample-tokens 0 --no-progress --plot-out "" --metrics-out "$work/m.jsonl" > "$work/run" 2>&1 ||
    { tail -3 "$work/run"; exit 1; }
  run=$(grep -o 'tensor peak per rank (MiB): .*' "$work/run" | sed 's/.*(MiB): //; s/[0-9] \([0-9.]*\)/\1/g')
  echo "| $schedule | $plan | $run | $held |"
done
