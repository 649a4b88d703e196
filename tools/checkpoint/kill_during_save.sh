#!/usr/bin/env bash
# kill_during_save: kills one rank of a checkpointing job at a random moment, TRIALS times, and
# checks that the latest committed checkpoint then verifies whole and that a resumed run goes on
# from it (cleaning up the save the kill interrupted).
#
#   bazel run //tools/checkpoint:kill_during_save -- 50
#
# Each trial: a 4-rank job (dp 2 x tp 2, a GPT of 4 layers x 256 so that saves take a good share
# of each step) checkpoints after every step; after a random 1.5-5 s one random rank gets SIGKILL
# (loomrun then stops the others). Counted: kills that landed inside a save (a step_N.partial
# or an unmarked step directory was left), corrupted restores (the latest committed step fails
# verify_checkpoint, or the resume fails) — the goal is 0 — and leftovers a resumed save did not
# clean up.
set -euo pipefail
trials="${1:-50}"
here="$(cd "$(dirname "$0")" && pwd)"
train="${TRAIN_GPT:-$here/../../examples/loom_train}"
loomrun="${LOOMRUN:-$here/../loomrun/loomrun}"
verify="${VERIFY_CHECKPOINT:-$here/verify_checkpoint}"
for tool in "$train" "$loomrun" "$verify"; do
  [[ -x "$tool" ]] || { echo "kill_during_save: $tool is not built (bazel build the tool)"; exit 2; }
done
work="${TEST_TMPDIR:-$(mktemp -d)}/kill_during_save"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
model=(--n-layer 4 --n-embd 256 --n-head 4 --sample-tokens 0 --no-progress)

# Whether a save was under way: a partial directory, or a step directory without its marker.
save_interrupted() {
  compgen -G "ckpt/*.partial" > /dev/null && return 0
  local d
  for d in ckpt/step_*; do
    [[ -d "$d" && ! -f "$d/COMMITTED" ]] && return 0
  done
  return 1
}

# The newest step directory with its marker ("" when none).
latest_committed() {
  local d latest=""
  for d in ckpt/step_*; do
    if [[ -f "$d/COMMITTED" ]]; then latest="$d"; fi
  done
  echo "$latest"
}

during=0 corrupted=0 leftovers=0 no_checkpoint=0
for ((t = 1; t <= trials; ++t)); do
  rm -rf ckpt && mkdir ckpt
  "$train" --launcher "$loomrun" --dp 2 --tp 2 --steps 100000 "${model[@]}" \
    --checkpoint-dir ckpt --checkpoint-every 1 --keep-last 3 --collective-timeout-s 10 \
    --metrics-out run.jsonl --plot-out run.png > run.log 2>&1 &
  job=$!
  sleep "$(awk -v s="$RANDOM" 'BEGIN { srand(s); printf "%.2f", 1.5 + 3.5 * rand() }')"
  ranks=($(pgrep -P "$job" || true))
  if ((${#ranks[@]} > 0)); then kill -9 "${ranks[RANDOM % ${#ranks[@]}]}" 2>/dev/null || true; fi
  wait "$job" 2>/dev/null || true
  if save_interrupted; then during=$((during + 1)); fi
  latest="$(latest_committed)"
  if [[ -z "$latest" ]]; then
    no_checkpoint=$((no_checkpoint + 1))
    echo "trial $t: killed before the first commit"
    continue
  fi
  if ! "$verify" "$latest" > verify.log 2>&1; then
    corrupted=$((corrupted + 1))
    echo "trial $t: CORRUPTED RESTORE: $(cat verify.log)"
    continue
  fi
  step=$((10#${latest##*step_}))
  if ! "$train" --launcher "$loomrun" --dp 2 --tp 2 --steps $((step + 1)) "${model[@]}" \
      --checkpoint-dir ckpt --resume --metrics-out resumed.jsonl --plot-out resumed.png \
      > resumed.log 2>&1; then
    corrupted=$((corrupted + 1))
    echo "trial $t: RESUME FAILED from $latest: $(tail -3 resumed.log)"
    continue
  fi
  if compgen -G "ckpt/*.partial" > /dev/null; then leftovers=$((leftovers + 1)); fi
  echo "trial $t: killed after step $step committed; verified, resumed to step $((step + 1))"
done
echo "kill_during_save: $trials trials, $during kills inside a save, $no_checkpoint before the" \
  "first commit, corrupted restores $corrupted, leftovers after a resumed save $leftovers"
((corrupted == 0 && leftovers == 0))
