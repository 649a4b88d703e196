#!/usr/bin/env bash
# Restart without a person (--max-restarts): a rank killed (SIGKILL) at a random step of a dp2 job
# that checkpoints every 2 steps; loomrun stops the other, starts the job again, which resumes
# from its latest checkpoint and finishes the planned steps; its losses equal an uninterrupted
# run's bit for bit (resume is bitwise), and its metrics file holds every step once. TRIALS
# trials (default 3; tools/fault/restart_trials.sh runs 20), each a random rank and step. Then a failure that repeats at the same step stops after
# 3 attempts with a report of each, instead of looping.
set -euo pipefail
train="$(realpath "$1")"
loomrun="$(realpath "$2")"
trials="${3:-3}"
cd "${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*" >&2; exit 1; }

common=(--launcher "$loomrun" --dp 2 --tp 1 --steps 12 --checkpoint-every 2 --sample-tokens 0
  --no-progress --plot-out "" --log-every 1)
losses() { sed -n 's/.*"loss":\([-0-9.e+]*\).*"step":\([0-9]*\).*/\2 \1/p' "$1"; }

"$train" "${common[@]}" --checkpoint-dir ref_ck --metrics-out ref.jsonl >ref.log 2>&1 ||
  { cat ref.log; fail "the uninterrupted run"; }
[[ $(losses ref.jsonl | wc -l) -eq 12 ]] || { cat ref.jsonl; fail "the reference has not 12 steps"; }

for trial in $(seq 1 "$trials"); do
  # A tiny step takes milliseconds: a job can finish between two looks at its progress. Such a
  # try is void (nothing was killed) and runs again, up to 3 times.
  killed=""
  for try in 1 2 3; do
    rank=$(( RANDOM % 2 )) step=$(( 1 + RANDOM % 9 ))
    dir="trial$trial"
    rm -rf "$dir" && mkdir -p "$dir"
    LOOM_FLIGHT_RECORDER_DIR="$PWD/$dir/flight" "$train" "${common[@]}" --max-restarts 3 \
      --checkpoint-dir "$dir/ck" --metrics-out "$dir/m.jsonl" >"$dir/log" 2>&1 &
    job=$!
    # Kill rank $rank once the job has completed step $step (rank 0 writes its progress there).
    for _ in $(seq 1 3000); do
      done_step=$(cat "$dir/flight/progress" 2>/dev/null || echo -1)
      if [[ $done_step =~ ^[0-9]+$ ]] && (( done_step >= step )); then
        # loom_train exec'd loomrun in its place: the job's pid is loomrun's, its children the
        # ranks.
        victim=$(pgrep -P "$job" | sort -n | sed -n "$(( rank + 1 ))p")
        [[ -n $victim ]] && kill -9 "$victim" && killed="$victim"
        break
      fi
      kill -0 "$job" 2>/dev/null || break
      sleep 0.01
    done
    status=0
    wait "$job" || status=$?
    (( status == 0 )) || { cat "$dir/log"; fail "trial $trial (rank $rank at step $step): exit $status"; }
    [[ -n $killed ]] && break
    echo "trial $trial, try $try: the job finished before rank $rank could be killed after step $step; again"
  done
  [[ -n $killed ]] || { cat "$dir/log"; fail "trial $trial: no rank to kill in 3 tries"; }
  grep -q "^loomrun: restart 1 of 3: rank [01] (pid $killed) was killed by signal 9 (SIGKILL)" "$dir/log" ||
    { cat "$dir/log"; fail "trial $trial: no restart logged for pid $killed"; }
  # The first checkpoint (of step 2) commits after step 1 and before step 2 runs: a kill once step
  # 2 is done always finds it; a kill after step 1 may come before it is begun (no step folder:
  # "no committed checkpoint") or while it is being written (a partial folder: "NO committed
  # step"), and then the restart rightly starts from step 0.
  how="resumed"
  if ! grep -Eq "resumed from .* at step [0-9]+ \\(same layout\\)" "$dir/log"; then
    how="started again from step 0 (killed before the first checkpoint was committed)"
    (( step < 2 )) &&
      grep -Eq "NO committed step: starting from step 0|no committed checkpoint in .*; starting at step 0" "$dir/log" ||
      { cat "$dir/log"; fail "trial $trial (rank $rank at step $step): the restart did not resume from a checkpoint"; }
  fi
  # The metrics hold every step once (the resumed attempt kept the earlier one's lines of the
  # steps its checkpoint holds and wrote the rest), each loss the uninterrupted run's bitwise.
  got=$(losses "$dir/m.jsonl")
  [[ $(cut -d' ' -f1 <<<"$got" | tr '\n' ' ') == "$(seq -s ' ' 0 11) " ]] ||
    { cat "$dir/log"; echo "$got"; fail "trial $trial: the metrics do not hold steps 0-11 once each"; }
  while read -r s l; do
    want=$(losses ref.jsonl | awk -v s="$s" '$1 == s { print $2 }')
    [[ $l == "$want" ]] || fail "trial $trial: step $s loss $l, uninterrupted $want"
  done <<<"$got"
  echo "ok: trial $trial: rank $rank killed after step $step; $how, losses bitwise equal"
done

# A failure at the same step every time (rank 1 fails at step 5 in every attempt): the job is not
# restarted a third time.
mkdir -p same
status=0
LOOM_INJECT_FAULT="rank=1,step=5" "$train" "${common[@]}" --max-restarts 5 \
  --checkpoint-dir same/ck --metrics-out same/m.jsonl >same/log 2>&1 || status=$?
(( status != 0 )) || { cat same/log; fail "a job failing every time succeeded"; }
# Each attempt names rank 1, the one that threw, not rank 0, which its failure ended (exit 3)
# and which may exit first.
attempt='rank 1 \(pid [0-9]+\) exited with status 1 at step 5'
grep -Eq "^loomrun: the job failed at step 5 3 times in a row; not restarting it again \\(attempt 1: $attempt; attempt 2: $attempt; attempt 3: $attempt\\)$" same/log ||
  { cat same/log; fail "no report of the repeated failure, naming rank 1 each time"; }
[[ $(grep -c "^loomrun: restart [0-9] of 5" same/log) -eq 2 ]] || { cat same/log; fail "expected 2 restarts"; }
echo "ok: a failure repeating at the same step stops after 3 attempts"
# The same with the flight recorder off (no dumps): the step each attempt failed at still comes
# from the progress file in loomrun's folder, which stays until the job ends.
mkdir -p same_off
status=0
LOOM_FLIGHT_RECORDER_ENTRIES=0 LOOM_INJECT_FAULT="rank=1,step=5" "$train" "${common[@]}" \
  --max-restarts 5 --checkpoint-dir same_off/ck --metrics-out same_off/m.jsonl >same_off/log 2>&1 ||
  status=$?
(( status != 0 )) || { cat same_off/log; fail "a job failing every time succeeded (recorder off)"; }
grep -Eq "^loomrun: the job failed at step 5 3 times in a row; not restarting it again" same_off/log ||
  { cat same_off/log; fail "recorder off: no report of the repeated failure at step 5"; }
! grep -q "cannot read the dumps" same_off/log || { cat same_off/log; fail "recorder off: the folder was gone"; }
echo "ok: with the flight recorder off, a failure repeating at the same step stops after 3 attempts"

# Bad input under a launcher the job did not start itself (loomrun -- prog, as torchrun would):
# each rank checks the job before it joins the others and exits 2; loomrun exits 2 and, that
# being bad input, does not restart it.
mkdir -p bad
status=0
"$loomrun" --nproc-per-node 2 --max-restarts 5 -- "$train" --dp 4 --tp 1 --steps 2 --sample-tokens 0 \
  --no-progress --metrics-out "" --plot-out "" >bad/log 2>&1 || status=$?
[[ $status -eq 2 ]] || { cat bad/log; fail "bad input under loomrun -- exited $status, expected 2"; }
grep -q "ParallelDims: dp_replicate=4 = 4 ranks, but the world has 2" bad/log || { cat bad/log; fail "bad input not named"; }
grep -q "bad input: a flag, file or layout); not restarting the job" bad/log || { cat bad/log; fail "bad input restarted"; }
! grep -q "restart 1 of 5" bad/log || { cat bad/log; fail "bad input restarted"; }
echo "ok: bad input under an outside launcher exits 2 and is not restarted"
