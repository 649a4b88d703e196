#!/usr/bin/env bash
# The main job runs, its loss falls (the program exits non-zero otherwise), and it reports it.
set -euo pipefail
binary="$1"
output=$("$binary" --steps 60 --log-every 20)
echo "$output"
grep -q "^step    0  loss" <<<"$output"
grep -q "training accuracy" <<<"$output"
# The program's own check: the final loss is below the first.
first=$(sed -n 's/^step    0  loss //p' <<<"$output")
last=$(sed -n 's/^step   60  loss //p' <<<"$output")
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a * 0.9) }' || {
  echo "loss did not fall by 10%: $first -> $last" >&2
  exit 1
}
