#!/usr/bin/env bash
# A failing rank stops the job: loomrun exits with its status and leaves no rank running.
LOOMRUN="$1"; HELPER="$2"; source "$3"

# Rank 1 exits 4 after 200 ms while the others would sleep 60 s.
mkdir -p "$WORK/pids1"
run_loomrun --nproc-per-node 4 --grace-s 5 -- "$HELPER" --pid-dir "$WORK/pids1" \
  --fail-rank 1 --exit-code 4 --fail-after-ms 200 --sleep-s 60
expect_eq "$RC" 4 "exit code when rank 1 exits 4"
[[ $ELAPSED_MS -lt 5000 ]] || fail "loomrun took ${ELAPSED_MS} ms to stop the job (limit 5000)"
expect_grep "$WORK/err" '^loomrun: rank 1 \(pid [0-9]+\) exited with status 4; stopping the other 3 ranks$'
pid1=$(cat "$WORK/pids1/rank-1.pid")
expect_grep "$WORK/err" "rank 1 \\(pid $pid1\\)"
expect_eq "$(find "$WORK/pids1" -name 'rank-*.pid' | wc -l)" 4 "pid files"
expect_no_helper_left "$WORK/pids1"

# Rank 1 kills itself with SIGKILL: exit code 128 + 9, the message names the signal.
mkdir -p "$WORK/pids2"
run_loomrun --nproc-per-node 3 -- "$HELPER" --pid-dir "$WORK/pids2" \
  --kill-rank 1 --signal 9 --fail-after-ms 200 --sleep-s 60
expect_eq "$RC" 137 "exit code when rank 1 is killed by SIGKILL"
[[ $ELAPSED_MS -lt 5000 ]] || fail "loomrun took ${ELAPSED_MS} ms to stop the job (limit 5000)"
expect_grep "$WORK/err" '^loomrun: rank 1 \(pid [0-9]+\) was killed by signal 9 \(SIGKILL\); stopping the other 2 ranks$'
expect_no_helper_left "$WORK/pids2"

# A rank that ignores SIGTERM is killed after the grace period.
mkdir -p "$WORK/pids3"
run_loomrun --nproc-per-node 2 --grace-s 0.5 -- "$HELPER" --pid-dir "$WORK/pids3" \
  --ignore-term --fail-rank 0 --exit-code 5 --fail-after-ms 300 --sleep-s 60
expect_eq "$RC" 5 "exit code when rank 0 exits 5"
[[ $ELAPSED_MS -lt 5000 ]] || fail "loomrun took ${ELAPSED_MS} ms to kill the job (limit 5000)"
expect_grep "$WORK/err" '^loomrun: 1 rank still running 0.5 s after SIGTERM; sending SIGKILL: rank 1 \(pid [0-9]+\)$'
expect_no_helper_left "$WORK/pids3"

# Rank 1 exits 0 early; the others fail 0.6 s later (as peers that lost it would): the last line
# names rank 1's departure as the cause, not only the survivor that failed.
mkdir -p "$WORK/pids4"
run_loomrun --nproc-per-node 3 -- "$HELPER" --pid-dir "$WORK/pids4" \
  --fail-rank 1 --exit-code 0 --fail-after-ms 100 --sleep-s 0.7 --others-exit-code 1
expect_eq "$RC" 1 "exit code when the others fail after rank 1 left"
pid1=$(cat "$WORK/pids4/rank-1.pid")
expect_grep "$WORK/err" "^loomrun: rank [02] \\(pid [0-9]+\\) exited with status 1"
tail -1 "$WORK/err" | grep -Eq "^loomrun: rank 1 \\(pid $pid1\\) had exited 0 after [0-9.]+ s, [0-9.]+ s before the first failure, while the others still ran: they were waiting for it$" ||
  { cat "$WORK/err"; fail "the last line does not name rank 1's departure"; }
expect_no_helper_left "$WORK/pids4"

# Status 3 says another rank's failure ended this one (a Loom rank's comm::PeerFailure): loomrun
# waits for the rank that failed of itself, which exits a moment later, and names it (its status
# is the job's), though rank 1 was reaped first.
run_loomrun --nproc-per-node 3 -- bash -c \
  'case $RANK in 1) sleep 0.1; exit 3;; 2) sleep 0.8; exit 1;; *) sleep 60;; esac'
expect_eq "$RC" 1 "exit code when rank 2 fails after rank 1 exited 3"
[[ $ELAPSED_MS -lt 5000 ]] || fail "loomrun took ${ELAPSED_MS} ms to stop the job (limit 5000)"
expect_grep "$WORK/err" '^loomrun: rank 1 \(pid [0-9]+\) exited with status 3: another rank failed; waiting up to 10 s for that one to exit$'
expect_grep "$WORK/err" '^loomrun: rank 2 \(pid [0-9]+\) exited with status 1; stopping the other rank$'

# When no rank fails of itself within 10 s, the one that exited 3 stops the job.
run_loomrun --nproc-per-node 3 -- bash -c 'if [ "$RANK" = 1 ]; then sleep 0.1; exit 3; fi; sleep 60'
expect_eq "$RC" 3 "exit code when only rank 1 exits 3"
[[ $ELAPSED_MS -ge 10000 && $ELAPSED_MS -lt 30000 ]] ||
  fail "loomrun took ${ELAPSED_MS} ms to stop the job (expected 10 to 30 s)"
expect_grep "$WORK/err" '^loomrun: no rank failed of itself within 10 s; stopping the other 2 ranks$'

# Every rank exits 3 (they all lost a peer none of them names): the job stops at once, with the
# first of them as its cause; a rank that exits 0 during the wait is not named as a cause.
run_loomrun --nproc-per-node 3 -- bash -c 'sleep 0.$((RANK + 1)); exit 3'
expect_eq "$RC" 3 "exit code when every rank exits 3"
[[ $ELAPSED_MS -lt 5000 ]] || fail "loomrun took ${ELAPSED_MS} ms although every rank had exited"
# Named as no more the cause than the others (a collective that timed out on every rank).
expect_grep "$WORK/err" '^loomrun: rank 0 \(pid [0-9]+\) exited with status 3, as every rank that failed did \(3\): each failed on a peer'
run_loomrun --nproc-per-node 3 -- bash -c \
  'case $RANK in 1) sleep 0.1; exit 3;; 2) sleep 0.5; exit 0;; *) sleep 60;; esac'
expect_eq "$RC" 3 "exit code when rank 1 exits 3 and rank 2 exits 0 after it"
! grep -q "had exited 0" "$WORK/err" || { cat "$WORK/err"; fail "a rank that left after the failure was named as its cause"; }

# A rank stopped (SIGSTOP) while another exits 3 for want of it: no rank will fail of itself, so
# loomrun stops the job at once and names the stopped one last, whatever the collectives' timeout.
run_loomrun --nproc-per-node 3 -- bash -c \
  'case $RANK in 1) sleep 0.2; kill -STOP $$;; 0) sleep 0.6; exit 3;; *) sleep 60;; esac'
expect_eq "$RC" 3 "exit code when rank 0 exits 3 for a stopped rank 1"
[[ $ELAPSED_MS -lt 5000 ]] || fail "loomrun took ${ELAPSED_MS} ms to stop the job (limit 5000)"
tail -1 "$WORK/err" | grep -Eq '^loomrun: rank 1 \(pid [0-9]+\), stopped by SIGSTOP when the first rank failed: the others were waiting for it$' ||
  { cat "$WORK/err"; fail "the last line does not name the stopped rank 1"; }
# With --max-restarts the restart names the stopped rank as the cause, not the one that exited 3.
run_loomrun --nproc-per-node 3 --max-restarts 1 -- bash -c \
  'case $RANK in 1) sleep 0.2; kill -STOP $$;; 0) sleep 0.6; exit 3;; *) sleep 60;; esac'
expect_grep "$WORK/err" '^loomrun: restart 1 of 1: rank 1 \(pid [0-9]+\), stopped by SIGSTOP while the others waited for it before its first step; starting the job again'

# Ranks all exit 0: loomrun exits 0 and says nothing of its own.
run_loomrun --nproc-per-node 2 -- "$HELPER" --sleep-s 0.1
expect_eq "$RC" 0 "exit code when every rank exits 0"
grep -q '^loomrun:' "$WORK/err" && fail "loomrun printed a message for a clean run"

# A rank stopped (SIGSTOP) after every other rank exited 0 has no peer left to time out waiting
# for it: loomrun kills it after the collectives' timeout ($LOOM_TIMEOUT_S) instead of waiting
# forever, and the job fails.
export LOOM_TIMEOUT_S=1
run_loomrun --nproc-per-node 2 -- bash -c 'if [ "$RANK" = 1 ]; then sleep 0.3; kill -STOP $$; fi'
unset LOOM_TIMEOUT_S
expect_eq "$RC" 1 "exit code when the last rank stays stopped"
[[ $ELAPSED_MS -lt 10000 ]] || fail "loomrun took ${ELAPSED_MS} ms to give up on the stopped rank"
expect_grep "$WORK/err" '^loomrun: 1 rank stopped for 1 s after every other rank had exited: no peer is left to wait for it; killing it$'

# A program that does not exist: 127, named.
run_loomrun --nproc-per-node 2 -- ./no/such/program --flag
expect_eq "$RC" 127 "exit code for a missing program"
expect_line "$WORK/err" "loomrun: rank 0: cannot start './no/such/program': No such file or directory"
echo PASS
