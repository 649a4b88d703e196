#!/usr/bin/env bash
# `loom plan --search` as a user runs it: the search over 4 ranks prints its ranking and the
# winner's job-file lines, and those lines, given to `loom_train --config`, run the job.
set -euo pipefail
train="$(realpath "$1")"
loomrun="$(realpath "$2")"
cd "${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*" >&2; exit 1; }

"$train" --plan --dp 2 --tp 2 --n-layer 4 --search --search-top 3 --plan-rank-tflops 0.05 \
  --plan-link-gbps 1 >search.log 2>&1 || { cat search.log; fail "the search"; }
grep -Eq "^loom plan --search: 44 layouts of 4 ranks: [0-9]+ rejected by the job's rules, [0-9]+ traced" search.log ||
  { cat search.log; fail "no summary"; }
[[ $(grep -c "^| [0-9] | tp" search.log) -eq 3 ]] || { cat search.log; fail "not 3 layouts shown"; }
# The winner's lines, as a job file: they run the job (on the ranks they name).
sed -n '/^The winner.s job-file lines:$/,$p' search.log | tail -n +3 >winner.toml
grep -q "^\[parallel\]" winner.toml || { cat search.log; fail "no job-file lines"; }
"$train" --launcher "$loomrun" --config winner.toml --n-layer 4 --steps 2 --sample-tokens 0 \
  --no-progress --plot-out "" --metrics-out run.jsonl >run.log 2>&1 ||
  { cat winner.toml run.log; fail "the winner's job file did not run"; }
[[ $(grep -c '"step"' run.jsonl) -eq 2 ]] || { cat run.log; fail "the winner's job did not run 2 steps"; }
echo "ok: the search's winner ($(grep -v '^$' winner.toml | tr '\n' ' ')) runs from its job file"
