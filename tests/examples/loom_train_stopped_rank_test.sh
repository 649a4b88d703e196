#!/usr/bin/env bash
# A rank stopped by SIGSTOP in the middle of the job: its peer fails within the job's collective
# timeout (--collective-timeout-s 5) naming the rank that did not arrive, the launcher stops the
# job, and its last line names the stopped rank (not the survivor that exited first).
set -euo pipefail
train="$(realpath "$1")"
loomrun="$(realpath "$2")"
cd "${TEST_TMPDIR:-$(mktemp -d)}"

"$train" --launcher "$loomrun" --dp 2 --tp 1 --steps 1000000 --collective-timeout-s 5 --no-progress \
  --log-every 100000 >out.log 2>err.log &
job=$!
# Wait for both ranks to train (the metrics file grows), then stop rank 1.
for _ in $(seq 100); do
  [[ -s loom_train_metrics.jsonl ]] && break
  sleep 0.2
done
stopped=""
# loom_train execs loomrun in place ($job), whose children are the ranks: only ours.
for pid in $(pgrep -P "$job" || true); do
  if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx 'RANK=1'; then
    kill -STOP "$pid"
    stopped="$pid"
  fi
done
[[ -n "$stopped" ]] || { kill "$job"; cat err.log; echo "FAIL: found no rank 1 to stop"; exit 1; }
start=$(date +%s)
status=0
wait "$job" || status=$?
elapsed=$(( $(date +%s) - start ))
echo "job ended $elapsed s after rank 1 (pid $stopped) was stopped, exit status $status"
cat err.log
[[ $status -ne 0 ]] || { echo "FAIL: the job succeeded"; exit 1; }
# The 5 s timeout, plus the launcher's stop and scheduling slack on 2 cores.
(( elapsed <= 20 )) || { echo "FAIL: took $elapsed s for a 5 s timeout"; exit 1; }
# Stopped between collectives, rank 1 never arrives at the next one; stopped inside one (it had
# started it, then stopped sending), its data never comes. Either way the survivor names it.
grep -qE "ranks \[1\] did not arrive|no data from rank 1 before the deadline" err.log ||
  { echo "FAIL: the survivor did not name rank 1"; exit 1; }
last="$(tail -n 1 err.log)"
[[ "$last" == "loomrun: rank 1 (pid $stopped), stopped by SIGSTOP when the first rank failed: the others were waiting for it" ]] ||
  { echo "FAIL: the last line does not name the stopped rank: $last"; exit 1; }
