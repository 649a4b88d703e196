#!/bin/bash
# What one training step asks of a GPU, counted on the emulated device (device/emulated_counts.h):
# kernel launches by kernel, GEMMs, copies by direction and synchronizations, for one rank of a
# GPT-2-small-shaped job (12 layers, heads of 64 as GPT-2 small's (2 of them), width 128,
# vocabulary 50257, so every kernel GPT-2 small runs is run, at a size the emulator runs in
# seconds; what is counted does not depend on the width). The job runs 2 and then 3 steps; the
# difference is one steady step. dp2 on the emulated GPU (a one-rank GPU job needs NCCL), so the
# counts include DDP's staged all-reduce copies; the last lines say how many.
#
#   tools/cuda_emulator/launch_counts.sh [extra loom_train flags, e.g. --model llama-tiny]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "${root}"
bazel build --config=cuda_emulated --ui_event_filters=-info --noshow_progress \
  //examples:loom_train //tools/loomrun
work="$(mktemp -d)"
cp bazel-bin/examples/loom_train bazel-bin/tools/loomrun/loomrun "${work}/"
cd "${work}"
for steps in 2 3; do
  mkdir -p "counts${steps}"
  LOOM_EMULATED_COUNTS="${work}/counts${steps}/rank" ./loom_train --launcher ./loomrun \
    --device cuda --model small --n-embd 128 --n-head 2 --seq-len 64 --batch-size 4 --dp 2 \
    --tp 1 --mixed-precision bf16 --steps "${steps}" --log-every 1 --no-progress \
    --sample-tokens 0 "$@" > "run${steps}.log" 2>&1 ||
    { echo "launch_counts: the ${steps}-step run failed (${work}/run${steps}.log)" >&2; exit 1; }
done
# Each rank wrote <prefix>.<rank>: rank 0's two runs, subtracted. A name whose count fell is an
# error (the runs differ in more than a step), not a line to drop.
awk 'NR == FNR { before[substr($0, index($0, " ") + 1)] = $1; next }
     { name = substr($0, index($0, " ") + 1); n = $1 - before[name]; delete before[name]
       if (n < 0) { print "launch_counts: " name " fell by " (-n) > "/dev/stderr"; bad = 1 }
       if (n > 0) print n, name }
     END { for (name in before) { print "launch_counts: " name " only in the 2-step run" > "/dev/stderr"; bad = 1 }
           exit bad }' \
  counts2/rank.0 counts3/rank.0 | sort -rn > step.txt
echo "One steady training step on one of 2 ranks (GPT-2 small's layers, bf16; ${work}/step.txt):"
echo
echo "| per step | what |"
echo "|---:|---|"
awk '{ n = $1; $1 = ""; printf "| %d | %s |\n", n, substr($0, 2) }' step.txt
echo
awk '$2 == "launch" { l += $1 } $2 == "gemm" { g += $1 } $2 == "copy" { c += $1 } $2 == "sync" { s += $1 }
     END { printf "kernel launches %d, GEMMs %d (launches too), copies %d, synchronizations %d\n", l, g, c, s }' step.txt
