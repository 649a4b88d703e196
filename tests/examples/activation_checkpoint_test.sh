#!/usr/bin/env bash
# Activation checkpointing through the job (--activation-checkpoint): full, selective-layer:2 and
# selective-op give losses bitwise equal to none (the recompute runs the same kernels on the same values; each
# block is called once per microbatch) for GPT and Llama on 1 rank, tp2 + SP, pp2 with 1F1B and
# interleaved, dp2 x tp2 and dp_shard2 x tp2, and keep less: the step's tensor peak falls.
set -euo pipefail
train="$(realpath "$1")"
loomrun="$(realpath "$2")"
cd "${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*" >&2; exit 1; }

losses() { sed -n 's/.*"loss":\([-0-9.e+]*\).*/\1/p' "$1"; }  # the step lines' losses
peak() { sed -n 's/.*"step":2,"tensor_peak_bytes":\([0-9]*\).*/\1/p' "$1"; }

check() {  # check NAME FLAGS...
  local name="$1"
  shift
  for mode in none full selective-layer:2 selective-op; do
    "$train" --launcher "$loomrun" --n-layer 4 --steps 4 --batch-size 8 --seq-len 32 \
      --sample-tokens 0 --no-progress --plot-out "" --metrics-out "$name.$mode.jsonl" \
      --activation-checkpoint "$mode" "$@" >"$name.$mode.log" 2>&1 ||
      { cat "$name.$mode.log"; fail "$name --activation-checkpoint $mode"; }
  done
  for mode in full selective-layer:2 selective-op; do
    [[ "$(losses "$name.none.jsonl")" == "$(losses "$name.$mode.jsonl")" ]] ||
      fail "$name: $mode's losses are not none's: $(losses "$name.$mode.jsonl" | tr '\n' ' ') vs $(losses "$name.none.jsonl" | tr '\n' ' ')"
  done
  local none full layer op
  none=$(peak "$name.none.jsonl") full=$(peak "$name.full.jsonl") layer=$(peak "$name.selective-layer:2.jsonl")
  op=$(peak "$name.selective-op.jsonl")
  # A pipeline rank's peak may or may not hold one received activation (when the receive's buffer
  # is freed against the rest is timing): $SLACK bytes, one microbatch's (B, T, C) in f32.
  (( full <= op + SLACK && op < none )) ||
    fail "$name: tensor peaks full $full, selective-op $op, none $none do not fall in that order"
  # (Rank 0's peak: under interleaving it holds blocks 0 and 2 alone, both checkpointed by
  # selective-layer:2 too.)
  (( full <= layer + SLACK && layer < none )) ||
    fail "$name: tensor peaks full $full, selective-layer:2 $layer, none $none do not fall in that order"
  echo "ok: $name (tensor peak none $none, selective-layer:2 $layer, selective-op $op, full $full bytes)"
}

SLACK=0
for model in tiny llama-tiny; do
  check "$model.one" --model "$model" --dp 1 --tp 1
  check "$model.tp2" --model "$model" --dp 1 --tp 2
  # 8 sequences in 4 microbatches: (2, 32, 64) f32 cross each stage boundary.
  SLACK=$((2 * 32 * 64 * 4))
  check "$model.pp2" --model "$model" --dp 1 --tp 1 --pp 2 --microbatches 4
  check "$model.interleaved" --model "$model" --dp 1 --tp 1 --pp 2 --schedule interleaved \
    --virtual-stages 2 --microbatches 4
  SLACK=0
  check "$model.grid" --model "$model" --dp 2 --tp 2
  check "$model.fsdp" --model "$model" --dp 0 --dp-shard 2 --tp 2
done
echo "ok: activation checkpointing equals the plain run on every layout and keeps less"
