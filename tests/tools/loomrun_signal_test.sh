#!/usr/bin/env bash
# SIGTERM/SIGINT to loomrun reach every rank; --timeout-s stops a job that runs too long.
LOOMRUN="$1"; HELPER="$2"; source "$3"

# start_loomrun PID_DIR ARGS...: loomrun in the background (LOOMRUN_PID), killed after 30 s.
start_loomrun() {
  "$LOOMRUN" "$@" >"$WORK/out" 2>"$WORK/err" &
  LOOMRUN_PID=$!
  ( sleep 30; kill -KILL "$LOOMRUN_PID" 2>/dev/null ) &
  WATCHDOG_PID=$!
}
finish_loomrun() {
  set +e
  wait "$LOOMRUN_PID"
  RC=$?
  set -e
  kill "$WATCHDOG_PID" 2>/dev/null || true
}

for signal in TERM INT; do
  number=$(kill -l "$signal")
  dir="$WORK/pids-$signal"
  mkdir -p "$dir"
  start_loomrun --nproc-per-node 3 --grace-s 5 -- "$HELPER" --pid-dir "$dir" --trap-term --sleep-s 60
  wait_for_files "$dir" 3  # every rank has installed its SIGTERM handler
  kill "-$signal" "$LOOMRUN_PID"
  finish_loomrun
  expect_eq "$RC" $((128 + number)) "loomrun's exit code after SIG$signal"
  expect_line "$WORK/err" "loomrun: got SIG$signal; forwarding it to 3 ranks"
  if [[ $signal == TERM ]]; then
    # The helper traps SIGTERM, says so and exits 0.
    for r in 0 1 2; do expect_line "$WORK/out" "[rank $r] rank $r got SIGTERM"; done
  fi
  expect_no_helper_left "$dir"
done

# A second signal while stopping kills ranks that ignore SIGTERM at once.
mkdir -p "$WORK/pids-twice"
start_loomrun --nproc-per-node 2 --grace-s 60 -- "$HELPER" --pid-dir "$WORK/pids-twice" \
  --ignore-term --sleep-s 60
wait_for_files "$WORK/pids-twice" 2
start=$(now_ms)
kill -TERM "$LOOMRUN_PID"
sleep 0.2
kill -TERM "$LOOMRUN_PID"
finish_loomrun
expect_eq "$RC" 143 "exit code after two SIGTERMs"
[[ $(( $(now_ms) - start )) -lt 5000 ]] || fail "the second SIGTERM did not kill the ranks at once"
expect_line "$WORK/err" "loomrun: got SIGTERM while stopping; sending SIGKILL to 2 ranks"
expect_no_helper_left "$WORK/pids-twice"

# --timeout-s: the job is stopped and loomrun exits 124.
mkdir -p "$WORK/pids-timeout"
run_loomrun --nproc-per-node 2 --timeout-s 0.5 -- "$HELPER" --pid-dir "$WORK/pids-timeout" \
  --trap-term --sleep-s 60
expect_eq "$RC" 124 "exit code after --timeout-s"
[[ $ELAPSED_MS -lt 5000 ]] || fail "--timeout-s 0.5 took ${ELAPSED_MS} ms"
expect_line "$WORK/err" "loomrun: --timeout-s 0.5 reached with 2 ranks running; stopping them"
expect_line "$WORK/out" "[rank 0] rank 0 got SIGTERM"
expect_no_helper_left "$WORK/pids-timeout"
echo PASS
