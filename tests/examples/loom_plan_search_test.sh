#!/usr/bin/env bash
# `loom plan --search` as a user runs it: the search over 4 ranks prints its ranking and the
# winner's job-file lines, and those lines, given to `loom_train --config`, run the job. Run
# again, it reads every trace back from the trace cache and ranks the same; --no-search-cache
# traces anew.
set -euo pipefail
train="$(realpath "$1")"
loomrun="$(realpath "$2")"
cd "${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*" >&2; exit 1; }
export LOOM_CACHE_DIR="$PWD/cache"

"$train" --plan --dp 2 --tp 2 --n-layer 4 --search --search-top 3 --plan-rank-tflops 0.05 \
  --plan-link-gbps 1 >search.log 2>&1 || { cat search.log; fail "the search"; }
grep -Eq "^loom plan --search: 126 layouts of 4 ranks: [0-9]+ rejected by the job's rules, .* [0-9]+ traced" search.log ||
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

# Again: the traces come back from the cache, the ranking is the same.
"$train" --plan --dp 2 --tp 2 --n-layer 4 --search --search-top 3 --plan-rank-tflops 0.05 \
  --plan-link-gbps 1 >again.log 2>&1 || { cat again.log; fail "the search again"; }
traced=$(sed -n "s/.* \([0-9]*\) traced (.*/\1/p" search.log)
grep -Eq "^loom plan --search: 126 layouts of 4 ranks: .*, 0 traced, $traced read back from the trace cache" again.log ||
  { cat again.log; fail "the second search did not read its $traced traces back"; }
grep -q "^traces kept in $LOOM_CACHE_DIR/plan_traces/[0-9a-f]\{64\}$" again.log || { cat again.log; fail "no cache folder"; }
diff <(sed -n '/^| rank/,$p' search.log) <(sed -n '/^| rank/,$p' again.log) ||
  fail "the ranking read back from the cache differs"
"$train" --plan --dp 2 --tp 2 --n-layer 4 --search --search-top 3 --plan-rank-tflops 0.05 \
  --plan-link-gbps 1 --no-search-cache >fresh.log 2>&1 || { cat fresh.log; fail "--no-search-cache"; }
grep -q "$traced traced (.*), 0 read back" fresh.log || { cat fresh.log; fail "--no-search-cache read the cache"; }
grep -q "^traces kept in" fresh.log && fail "--no-search-cache kept traces"
echo "ok: the second search read its $traced traces back and ranked the same"

# The command line's layout is the one the search replaces: a layout the job would refuse (tp 4
# of a 2-head model), --nproc beside degrees that make another count (dp 2 x tp 2 x pp 4 would
# make 16), or another valid layout, still says only how many ranks to lay out: the same
# ranking as from --dp 2 --tp 2 (for the same model).
for layout in "--tp 4 --dp 1 --pp 1 --n-head 2" "--nproc 4 --pp 4" "--tp 1 --dp 1 --pp 4"; do
  # shellcheck disable=SC2086
  "$train" --plan --n-layer 4 --search --search-top 3 --plan-rank-tflops 0.05 --plan-link-gbps 1 \
    $layout >other.log 2>&1 || { cat other.log; fail "a search from the layout '$layout'"; }
  [[ $layout == *"--n-head 2"* ]] && continue  # another model: another ranking
  diff <(sed -n '/^| rank/,$p' search.log) <(sed -n '/^| rank/,$p' other.log) ||
    fail "the search from '$layout' ranked otherwise than from --dp 2 --tp 2"
done
echo "ok: a search from a layout the job would refuse, or from --nproc alone, ranks as from a valid one"
# A budget that runs out before any trace says so, not that no layout fits; a search that ranks
# nothing exits 2, so a script sees it.
status=0
"$train" --plan --dp 2 --tp 2 --n-layer 4 --search --no-search-cache --search-budget-s 0.000001 \
  --plan-rank-tflops 0.05 --plan-link-gbps 1 >budget.log 2>&1 || status=$?
[[ $status -eq 2 ]] || { cat budget.log; fail "a search that ranked nothing exited $status, expected 2"; }
grep -q "^no layout ranked: the budget (--search-budget-s 1e-06) ran out before one was traced" budget.log ||
  { cat budget.log; fail "a spent budget reported as something else"; }
echo "ok: a spent budget is named"
# Layouts the job's rules reject are listed by reason (one example each); when every layout is
# rejected, the search says so and exits 2.
status=0
"$train" --plan --search --nproc 3 --batch-size 4 --seq-len 32 >rules.log 2>&1 || status=$?
[[ $status -eq 2 ]] || { cat rules.log; fail "a search with every layout rejected exited $status"; }
grep -qF "layout(s), as tp1 pp1 dp_shard1 dp_replicate3 ac=none: ParallelConfig: a global batch of 4 sequences does not split over dp x grad_accum = 3 x 1" rules.log ||
  { cat rules.log; fail "the rejection reason is not listed"; }
grep -q "^no layout ranked: every layout of 3 ranks breaks one of the job's rules (above)" rules.log ||
  { cat rules.log; fail "an all-rejected search is not named"; }
grep -q "^rejected by the job's rules, by reason:" search.log || { cat search.log; fail "no reasons in a normal search"; }
echo "ok: rejected layouts are listed by reason; a search that ranks nothing exits 2"
# A mixture of experts balances per microbatch: the search says its layouts differ in training.
"$train" --plan --search --nproc 2 --model llama-moe-tiny --batch-size 4 --seq-len 32 \
  --no-search-cache >moe.log 2>&1 || { cat moe.log; fail "the MoE search"; }
grep -q "^note: mixture of experts: the auxiliary loss is over each microbatch's tokens" moe.log ||
  { cat moe.log; fail "the MoE search does not say its layouts balance otherwise"; }
echo "ok: a MoE search names how its layouts' training differs"
