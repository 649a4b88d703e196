#!/bin/bash
# The training job on the emulated CUDA device (device/README.md) against the same job on CPU
# ranks: each layout runs 3 bf16 steps with --device cuda (its ranks sharing the emulated GPU over
# staged Gloo) and with --device cpu, and one line per layout prints both runs' losses, which
# agree to bf16 rounding. A single GPU's job needs NCCL, so every layout has 2 or more ranks.
#
#   tools/cuda_emulator/emulated_jobs.sh      # about 5 minutes on 2 cores, once built
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "${root}"
bazel build --config=cuda_emulated //examples:loom_train //tools/loomrun
work="$(mktemp -d)"
cp bazel-bin/examples/loom_train bazel-bin/tools/loomrun/loomrun "${work}/"
cd "${work}"
status=0
layout() {
  local name="$1"
  shift
  local line="${name}:"
  for device in cuda cpu; do
    if ./loom_train --launcher ./loomrun --device "${device}" --steps 3 --log-every 1 \
      --no-progress --sample-tokens 1 --mixed-precision bf16 --batch-size 4 "$@" \
      > "${name}.${device}.log" 2>&1; then
      line+=" ${device} $(grep -o '| loss [0-9.]*' "${name}.${device}.log" | cut -d' ' -f3 | paste -sd' ')"
    else
      line+=" ${device} FAILED (${work}/${name}.${device}.log)"
      status=1
    fi
  done
  echo "${line}"
}
layout gpt-tp2 --model tiny --tp 2 --dp 1
layout gpt-dp_shard2 --model tiny --tp 1 --dp-replicate 1 --dp-shard 2
layout gpt-pp2 --model tiny --tp 1 --dp 1 --pp 2
layout gpt-dp2-dropout --model tiny --tp 1 --dp 2 --dropout 0.1 --attn-dropout 0.1
layout llama-dp2 --model llama-tiny --tp 1 --dp 2
layout llama-tp2-checkpointed --model llama-tiny --tp 2 --dp 1 --activation-checkpoint full
layout llama-cp2-ring --model llama-tiny --tp 1 --dp-replicate 1 --cp 2 --cp-attention ring \
  --seq-len 64
layout moe-dp_shard2-ep2 --model llama-moe-tiny --tp 1 --dp-replicate 1 --dp-shard 2 --ep 2
exit "${status}"
