#!/usr/bin/env bash
# Fault tolerance across replicas (--replicas): replica jobs (each its own loomrun launch, tp2 or
# tp1) share a lighthouse's quorum store and average their gradients each step over those that
# take part. One replica is killed (SIGKILL to its loomrun) at a random step and started again some
# steps later: the others never stop and lose no step (one fewer replica meanwhile, recorded per
# step in the metrics), the new one joins the running job with a member's state, and every
# replica ends with the same model, bit for bit, which is also the model of one job replaying
# the recorded membership (--replica-replay). For 2 and 3 replicas x tp2, the three with dropout
# (each replica drops its share's rows of one job's masks, as the replay does).
set -euo pipefail
train="$(realpath "$1")"
loomrun="$(realpath "$2")"
lighthouse="$(realpath "$3")"
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

scenario() {  # scenario NAME REPLICAS TP [MODEL FLAGS...]
  local name="$1" replicas="$2" tp="$3" steps=40
  local model=("${@:4}")
  mkdir -p "$name" && cd "$name"
  # The log exists before the background job opens it: a look at it may come first (and set -e
  # ends the test on sed's "can't read").
  : >lighthouse.log
  "$lighthouse" --port 0 --bind 127.0.0.1 >lighthouse.log 2>&1 &
  local lh=$! port=""
  for _ in $(seq 1 200); do
    port=$(sed -n 's/.*127.0.0.1:\([0-9]*\)$/\1/p' lighthouse.log)
    [[ -n $port ]] && break
    sleep 0.02
  done
  [[ -n $port ]] || { cat lighthouse.log; fail "$name: the lighthouse did not start"; }
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

scenario two_by_tp2 2 2
scenario three_by_tp2_dropout 3 2 --dropout 0.1 --attn-dropout 0.1
