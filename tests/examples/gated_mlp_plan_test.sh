#!/usr/bin/env bash
# The user-style example: a custom style and a shared-input plan for a gated block match one
# rank on 2 and 3 ranks (5 tokens: uneven sequence shards), gathering the feed-forward's input
# once in forward and reducing its gradient once in backward.
set -euo pipefail
program="$(realpath "$1")"
loomrun="$(realpath "$2")"
cd "${TEST_TMPDIR:-$(mktemp -d)}"
for ranks in 2 3; do
  "$loomrun" --nproc-per-node "$ranks" -- "$program" > "run$ranks.log" 2>&1 ||
    { cat "run$ranks.log"; exit 1; }
  grep -q "forward: all_gather: 1 (.*), reduce_scatter: 1 " "run$ranks.log" ||
    { echo "the forward should gather once and reduce-scatter once:"; cat "run$ranks.log"; exit 1; }
  grep -q "backward: .*reduce_scatter: 1 " "run$ranks.log" ||
    { echo "the backward should reduce-scatter once:"; cat "run$ranks.log"; exit 1; }
done
echo "ok: the gated block's plan matches one rank"
