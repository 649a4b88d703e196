#!/usr/bin/env bash
# The README's example of a user's own job (examples/my_gpt_job.cc) trains through the library's
# composition and step driver on 4 ranks (dp=2 x tp=2) and on 1: its loss falls (the program
# exits 1 otherwise) and ends the same on both.
set -euo pipefail
job="$(realpath "$1")"
loomrun="$(realpath "$2")"
cd "${TEST_TMPDIR:-$(mktemp -d)}"
for ranks in 4 1; do
  timeout 120 "$loomrun" --nproc-per-node "$ranks" -- "$job" >"job$ranks.log" 2>&1 ||
    { cat "job$ranks.log"; echo "my_gpt_job failed on $ranks ranks"; exit 1; }
  grep -q 'loss [0-9.]* -> [0-9.]*' "job$ranks.log" || { cat "job$ranks.log"; exit 1; }
  grep 'loss .* ->' "job$ranks.log"
done
grep -q 'dp_replicate=2 x tp=2' job4.log || { cat job4.log; echo "4 ranks should be dp_replicate=2 x tp=2"; exit 1; }
# The layout leaves the math unchanged: the same final loss on 4 ranks as on 1 (printed to 1e-4;
# f32 rounding differs far below that).
final() { sed -n 's/.*-> \([0-9.]*\)$/\1/p' "$1"; }
awk -v a="$(final job4.log)" -v b="$(final job1.log)" 'BEGIN { d = a - b; if (d < 0) d = -d;
  if (d > 2e-4) { print "final loss " a " on 4 ranks vs " b " on 1"; exit 1 } }'
