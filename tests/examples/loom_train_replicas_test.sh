#!/usr/bin/env bash
# Fault tolerance across replicas (--replicas): replica jobs (each its own loomrun launch, tp2 or
# tp1) share a lighthouse's quorum store and average their gradients each step over those that
# take part. One replica is killed (SIGKILL to its loomrun) at a random step and started again some
# steps later: the others never stop and lose no step (one fewer replica meanwhile, recorded per
# step in the metrics), the new one joins the running job with a member's state, and every
# replica ends with the same model, bit for bit, which is also the model of one job replaying
# the recorded membership (--replica-replay). For 2 and 3 replicas x tp2, the three with dropout
# (each replica drops its share's rows of one job's masks, as the replay does), and 2 replicas
# of a mixture of experts whose routing biases move by the step's load over every replica.
set -euo pipefail
train="$(realpath "$1")"
loomrun="$(realpath "$2")"
lighthouse="$(realpath "$3")"
deepseek_fixture="$(realpath "$4")"
deepseek_fixture="${deepseek_fixture%.safetensors}"
cd "${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*" >&2; exit 1; }
progress() { cat "$1" 2>/dev/null || echo -1; }
wait_step() {  # wait_step FILE STEP: until rank 0 of a replica has completed STEP (3 min at most:
  # a member lost mid-step costs the others a connect or collective timeout, 10 or 30 s, and a
  # loaded machine more)
  for _ in $(seq 1 18000); do
    s=$(progress "$1")
    [[ $s =~ ^[0-9]+$ ]] && (( s >= $2 )) && return
    sleep 0.01
  done
  # What each replica and the lighthouse said, to tell a hang from a slow machine.
  for log in */log lighthouse.log; do [[ -f $log ]] && { echo "--- $log"; tail -15 "$log"; }; done
  fail "no progress to step $2 in $1 (at $(progress "$1"))"
}

start_lighthouse() {  # a lighthouse in this folder: its pid in $lh, its port in $port
  # The log exists before the background job opens it: a look at it may come first (and set -e
  # ends the test on sed's "can't read").
  : >lighthouse.log
  "$lighthouse" --port 0 --bind 127.0.0.1 >lighthouse.log 2>&1 &
  lh=$!
  port=""
  for _ in $(seq 1 200); do
    port=$(sed -n 's/.*127.0.0.1:\([0-9]*\)$/\1/p' lighthouse.log)
    [[ -n $port ]] && break
    sleep 0.02
  done
  [[ -n $port ]] || { cat lighthouse.log; fail "$PWD: the lighthouse did not start"; }
}

scenario() {  # scenario NAME REPLICAS TP [MODEL FLAGS...]
  local name="$1" replicas="$2" tp="$3" steps=40
  local model=("${@:4}")
  mkdir -p "$name" && cd "$name"
  start_lighthouse
  local common=(--launcher "$loomrun" --dp 1 --tp "$tp" --steps "$steps" --batch-size 12
    --replicas "$replicas" --replica-store "127.0.0.1:$port" --replica-join-window-ms 300
    --collective-timeout-s 30 --sample-tokens 0 --no-progress --plot-out "" --log-every 1
    "${model[@]}")
  start() {  # start REPLICA TAG: a replica job in the background; its pid in $started
    mkdir -p "$2"
    (LOOM_PROGRESS_FILE="$PWD/$2/progress" exec "$train" "${common[@]}" --replica "$1" \
      --metrics-out "$2/m.jsonl" --save "$2/model.safetensors" >"$2/log" 2>&1) &
    started=$!
  }
  local pids=() odd=$(( replicas - 1 ))
  for r in $(seq 0 $(( replicas - 1 ))); do start "$r" "r$r"; pids+=("$started"); done
  local kill_after=$(( 3 + RANDOM % 8 ))
  wait_step r0/progress "$kill_after"
  kill -9 "${pids[$odd]}"
  wait "${pids[$odd]}" 2>/dev/null || true
  wait_step r0/progress $(( kill_after + 4 ))
  start "$odd" "back"
  local back=$started
  for r in $(seq 0 $(( odd - 1 ))); do
    wait "${pids[$r]}" || { cat "r$r/log"; fail "$name: replica $r stopped"; }
  done
  wait "$back" || { cat back/log; fail "$name: the replica that came back failed"; }
  kill "$lh" 2>/dev/null || true
  # No step lost: replica 0 ran every step; one fewer replica while the killed one was away.
  [[ $(grep -c '"step"' r0/m.jsonl) -eq $steps ]] || fail "$name: replica 0 has not $steps steps"
  local counts
  counts=$(sed -n 's/.*"replicas":\([0-9]*\).*/\1/p' r0/m.jsonl | tr '\n' ' ')
  [[ $counts == "$replicas "* && $counts == *" $odd "* && $counts == *" $replicas " ]] ||
    fail "$name: replicas per step: $counts"
  grep -q "replica $odd joined the running job at step" back/log || { cat back/log; fail "$name: no join"; }
  # Every replica at the end (the survivors and the one that came back) holds the same model.
  local others=(back)
  for r in $(seq 1 $(( odd - 1 ))); do others+=("r$r"); done
  for dir in "${others[@]}"; do
    cmp -s r0/model.safetensors "$dir/model.safetensors" || fail "$name: r0's model and $dir's differ"
  done
  # The reference: one job replaying the recorded members of every step (each step the mean of
  # the members' shares' gradients, accumulated in member order then divided by their count, as
  # the replicas' all_reduce adds them): byte for byte the replicas' model.
  if (( replicas >= 2 )); then
    mkdir -p replay
    "$train" --launcher "$loomrun" --dp 1 --tp "$tp" --steps "$steps" --batch-size 12 \
      --replicas "$replicas" --replica-replay r0/m.jsonl --sample-tokens 0 --no-progress \
      "${model[@]}" --plot-out "" --metrics-out replay.jsonl --save replay/model.safetensors >replay.log 2>&1 ||
      { cat replay.log; fail "$name: the replay"; }
    cmp -s r0/model.safetensors replay/model.safetensors ||
      fail "$name: the replicas' model is not the replay of their recorded membership"
  fi
  echo "ok: $name: replica $odd killed after step $kill_after and back; replicas per step: $counts"
  cd ..
}

# A lighthouse outlives its jobs: replicas of a later job against it start from their own state
# at step 0 (not at the finished job's step); a second job given a replica id that runs is refused
# (exit 2, naming the other) while the job goes on; so is a replica of another layout.
later_jobs() {
  mkdir -p later && cd later
  start_lighthouse
  run() {  # run TAG REPLICA STEPS [FLAGS...]: a replica job in the background; its pid in $started
    mkdir -p "$1"
    (LOOM_PROGRESS_FILE="$PWD/$1/progress" exec "$train" --launcher "$loomrun" --dp 1 --tp 1 \
      --steps "$3" --batch-size 12 --replicas 2 --replica "$2" --replica-store "127.0.0.1:$port" \
      --replica-join-window-ms 300 --collective-timeout-s 30 --sample-tokens 0 --no-progress \
      --plot-out "" --log-every 1 --metrics-out "$1/m.jsonl" --save "$1/model.safetensors" \
      "${@:4}" >"$1/log" 2>&1) &
    started=$!
  }
  local a b
  run first0 0 4; a=$started; run first1 1 4; b=$started
  wait "$a" && wait "$b" || fail "later: the first job failed"
  run next0 0 4 --seed 7; a=$started; run next1 1 4 --seed 7; b=$started
  wait "$a" && wait "$b" || { cat next0/log next1/log; fail "later: the second job failed"; }
  for r in 0 1; do
    [[ $(sed -n '1s/.*"step":\([0-9]*\).*/\1/p' "next$r/m.jsonl") == 0 ]] ||
      { cat "next$r/log"; fail "later: replica $r of the second job did not start at step 0"; }
    ! grep -q "joined the running job" "next$r/log" || fail "later: replica $r joined the old job"
  done
  cmp -s next0/model.safetensors next1/model.safetensors || fail "later: the new pair's models differ"
  # A running pair, then a second replica 1 and a replica of another layout (tp2).
  run long0 0 400; a=$started; run long1 1 400; b=$started
  wait_step long0/progress 3
  run again1 1 400; local again=$started
  local status=0
  wait "$again" || status=$?
  [[ $status == 2 ]] || { cat again1/log; fail "later: a second replica 1 exited $status, not 2"; }
  grep -q -- "--replica 1: another job already runs replica 1 against this replica store (pid" \
    again1/log || { cat again1/log; fail "later: the second replica 1's message"; }
  run wide 1 400 --tp 2; local wide=$started
  status=0
  wait "$wide" || status=$?
  [[ $status == 2 ]] || { cat wide/log; fail "later: a replica on tp2 exited $status, not 2"; }
  grep -q -- "this job's settings differ from the running replicas' (this job: DeviceMesh(.*tp=2, cpu); replica [01]'s: DeviceMesh(.*tp=1, cpu))" wide/log ||
    { cat wide/log; fail "later: the tp2 replica's message (the layouts alone, named)"; }
  kill "$a" "$b" 2>/dev/null || true
  wait "$a" "$b" 2>/dev/null || true
  kill "$lh" 2>/dev/null || true
  echo "ok: later jobs start at step 0; a second replica 1 and a tp2 replica are refused"
  cd ..
}

scenario two_by_tp2 2 2
later_jobs
scenario three_by_tp2_dropout 3 2 --dropout 0.1 --attn-dropout 0.1
# A mixture of experts whose routing biases move (DeepSeek-V3's, from transformers' checkpoint,
# saved with its biases): the replicas move them by the whole step's load, as the replay does.
mkdir -p deepseek && cp "$deepseek_fixture.safetensors" deepseek/model.safetensors
cp "${deepseek_fixture}_config.json" deepseek/config.json
scenario moe_bias 2 1 --init-from "$PWD/deepseek" --moe-bias-update-rate 0.5 --seq-len 32
