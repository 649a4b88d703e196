#!/usr/bin/env bash
# A job whose ranks diverge fails, and loomrun's last lines are the merged flight-recorder report
# naming the collective and the ranks: a rank that hangs (its peers time out; it dumps on the
# SIGTERM that stops it), one that skips a collective, one that calls another size.
LOOMRUN="$1"; HELPER="$2"; source "$3"
export LOOM_TIMEOUT_S=3

# Rank 2 of 3 sleeps before the third all_reduce: ranks 0 and 1 time out in it.
run_loomrun --nproc-per-node 3 --grace-s 5 --flight-recorder-dir "$WORK/hang" -- "$HELPER" \
  --odd-rank 2 --how hang --sleep-s 60
expect_eq "$RC" 1 "exit code when ranks time out"
expect_grep "$WORK/err" "^loomrun: flight recorder: 3 rank dumps$"
expect_grep "$WORK/err" "^loomrun: group 'default' \\(global ranks 0, 1, 2\\): first divergence at all_reduce #2 \\(sum, f32, 1024 elements\\) on group 'default': entered by ranks 0, 1; not by rank 2$"
expect_grep "$WORK/err" "^loomrun:     rank 2 did not; its last operation: all_reduce #1 \\(sum, f32, 1024 elements\\) on group 'default', completed$"
expect_grep "$WORK/err" "^loomrun: flight recorder: the ranks' dumps are in $WORK/hang$"
[[ $ELAPSED_MS -lt 20000 ]] || fail "the hang took ${ELAPSED_MS} ms to report (limit 20000)"

# Rank 1 of 2 skips the third all_reduce and exits 0.
run_loomrun --nproc-per-node 2 --flight-recorder-dir "$WORK/skip" -- "$HELPER" --odd-rank 1 --how skip
expect_eq "$RC" 1 "exit code when a rank skips a collective"
expect_grep "$WORK/err" "first divergence at all_reduce #2 \\(sum, f32, 1024 elements\\) on group 'default': entered by rank 0; not by rank 1$"

# Rank 0 of 2 calls its second all_reduce with 2048 elements.
run_loomrun --nproc-per-node 2 --flight-recorder-dir "$WORK/size" -- "$HELPER" --odd-rank 0 --how size
expect_eq "$RC" 1 "exit code when the sizes differ"
expect_grep "$WORK/err" "^loomrun: group 'default' \\(global ranks 0, 1\\): the ranks called different operations as collective 1"
expect_grep "$WORK/err" "^loomrun:     rank 0 called all_reduce\\(sum, f32, 2048 elements\\)$"
expect_grep "$WORK/err" "^loomrun:     rank 1 called all_reduce\\(sum, f32, 1024 elements\\)$"

# A job that succeeds prints no report and leaves no folder of its own behind.
export TMPDIR="$WORK/tmp"
mkdir -p "$TMPDIR"
run_loomrun --nproc-per-node 2 -- "$HELPER" --odd-rank 5
expect_eq "$RC" 0 "exit code of a consistent job"
grep -q "flight recorder" "$WORK/err" && fail "a report for a job that succeeded"
[[ -z "$(ls -A "$TMPDIR")" ]] || fail "loomrun left $(ls "$TMPDIR") behind"
echo PASS
