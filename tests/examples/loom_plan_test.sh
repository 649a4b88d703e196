#!/usr/bin/env bash
# `loom plan` (loom_train --plan) as a user runs it: the default job's plan traces every role's
# memory, FLOPs and operations; without a calibration it says how to get a step time, with one
# (--calibrate into a private cache) it prints it; a layout the job rejects fails with the job's
# own message and exit 2 before any trace (as the job exits 2 before it starts); Llama and the
# large presets plan too; nothing aborts.
set -euo pipefail
train="$(realpath "$1")"
cd "${TEST_TMPDIR:-$(mktemp -d)}"
export LOOM_CACHE_DIR="$PWD/cache"

fail() { echo "FAIL: $*" >&2; exit 1; }

# plan EXPECTED_STATUS ARGS...: runs loom_train --plan ARGS into out.log / err.log.
plan() {
  local want="$1"
  shift
  local status=0
  "$train" --plan "$@" >out.log 2>err.log || status=$?
  [[ $status -eq $want ]] || { cat out.log err.log; fail "loom_train --plan $* exited $status, expected $want"; }
  ! grep -q "terminate called" out.log err.log || fail "loom_train --plan $* aborted"
}
expect_out() { grep -qF -- "$1" out.log || { cat out.log; fail "expected in the plan: $1"; }; }
expect_err() { grep -qF -- "$1" err.log || { cat err.log; fail "expected the message: $1"; }; }

plan 0
expect_out "layout dp_replicate=2 x tp=2 (4 ranks)"
expect_out "a traced step of the job's own code (allocating as the CPU kernels do)"
expect_out "| ranks | parameters | held between steps | peak in step | peak - held | GFLOP | peak building the model |"
expect_out "| 0-3 | mesh/dp_replicate | all_reduce | 2 |"
expect_out "| 0-3 | mesh/tp | reduce_scatter | 10 |"
expect_out "no step time: run \`./loom plan --calibrate\`"
echo "ok: the default job, no calibration"
# A save is not in the step's table: the plan says what one adds (the count a real save makes,
# checked in distributed_checkpoint_test), and plans without creating the folder.
plan 0 --steps 10 --checkpoint-dir never_made --checkpoint-every 4
expect_out "note: --checkpoint-dir: each save (3 in this run: every 4 steps and after the last) adds 14 all_gathers over the world's 4 ranks, of metadata only"
[[ ! -e never_made ]] || fail "loom plan made the checkpoint folder"
echo "ok: a checkpoint save's collectives are named beside the step's"

"$train" --plan --calibrate >cal.log 2>&1 || { cat cal.log; fail "--calibrate failed"; }
[[ -s cache/plan_machine.json ]] || fail "--calibrate wrote no cache/plan_machine.json"
grep -q '"gemm_flops_per_s"' cache/plan_machine.json || fail "no GEMM rate in the calibration"
plan 0
expect_out "ms per step"
expect_out "4 ranks share its"
# --val-data: a validation batch traced beside the step, and its time over the run.
head -c 20000 /usr/share/common-licenses/GPL-3 > val.txt
plan 0 --val-data val.txt --val-every 10 --steps 100
expect_out "Validation (--val-data: 19 batches of 16 x 64 tokens, 10 times in 100 steps; traced, forward only"
expect_out "| ranks | peak in a batch | peak - held | GFLOP per batch |"
expect_out "ms per training step averaged over the run"
echo "ok: validation planned"
echo "ok: calibrated step time"

plan 2 --tp 3 --dp-replicate 1
expect_err "loom_train --plan: ParallelConfig: sequence parallelism splits each sequence over tp ranks: a sequence length of 64 does not divide by tp 3"
plan 2 --tp 3 --dp-replicate 1 --no-sequence-parallel
expect_err "n_head=4 is not divisible by the tp mesh size 3"
plan 2 --model llama-tiny --pp 2 --tp 1 --dp-replicate 1 --schedule interleaved --virtual-stages 2 \
  --microbatches 4 --batch-size 8
expect_err "pp 2 under schedule interleaved has 4 stages (2 per rank), but the model has 2 layers"
plan 2 --plan-rank-tflops 100 --plan-link-gbps 50 --plan-dim-link-gbps dp=3
expect_err "--plan-dim-link-gbps: expected DIM=GBPS items separated by commas, DIM one of pp, dp_replicate, dp_shard, cp, tp, GBPS a positive number; got 'dp=3'"
plan 2 --plan-rank-tflops 100
expect_err "--plan-rank-tflops 100 needs --plan-link-gbps"
echo "ok: layouts the job rejects, bad machine flags"

# A job file plans as it trains (--config), flags overriding it.
cat >job.toml <<'TOML'
[parallel]
pp = 2
dp = 2
tp = 2
schedule = "1f1b"
microbatches = 4
TOML
plan 0 --config job.toml --seq-len 32
expect_out "layout pp=2 x dp_replicate=2 x tp=2 (8 ranks), 2 pipeline stages, global batch 16 x 32 tokens"
expect_out "mesh/pp | send"
echo "ok: a job file"

plan 0 --model llama-tiny --pp 2 --tp 2 --dp-replicate 1 --microbatches 4 --batch-size 8
expect_out "loom plan: Llama"
expect_out "mesh/pp | send"
plan 0 --model llama3-8b --tp 8 --dp-replicate 1 --dp-shard 2 --batch-size 2 \
  --seq-len 8192 --mixed-precision bf16 --device cuda --plan-rank-tflops 700 --plan-link-gbps 400 \
  --plan-peak-tflops 989
expect_out "(8030261248 parameters)"
expect_out "allocating as the GPU kernels do"
expect_out "MFU"
echo "ok: Llama, small and large (a preset carries its vocabulary)"

# The plan runs every check the job runs before its first step, with the job's messages: data
# shorter than a sequence, --resume from a checkpoint of another model, --init-from weights of
# other shapes (read from the file's header).
printf 'short text' >short.txt
plan 2 --data short.txt
expect_err "holds 10 tokens, too few for sequences of 64"
mkdir -p saved
"$train" --dp 1 --tp 1 --steps 1 --sample-tokens 0 --no-progress --checkpoint-dir ckpt \
  --save saved/model.safetensors --metrics-out m.jsonl --plot-out m.png >saved.log 2>&1 ||
  { cat saved.log; fail "saving a checkpoint"; }
plan 2 --dp 1 --tp 1 --n-embd 32 --checkpoint-dir ckpt --resume
expect_err "was saved from another model config: n_embd 64 there, 32 here"
rm saved/config.json
plan 2 --dp 1 --tp 1 --n-embd 32 --init-from saved/model.safetensors
expect_err "tensor 'transformer.wte.weight' has shape (256, 64) in the file but the model expects (256, 32)"
plan 0 --dp 1 --tp 1 --init-from saved/model.safetensors
echo "ok: the job's own checks before its first step"

# The job's step line and metrics report the step's tensor peak, the figure the plan predicts: on
# one rank, the plan's "peak in step" equals the run's second step to 2 %.
plan 0 --dp 1 --tp 1
planned=$(awk -F'|' '/held between steps/ { table = 1 } table && $2 ~ /^ 0 $/ { print $5; exit }' out.log)
"$train" --dp 1 --tp 1 --steps 2 --sample-tokens 0 --no-progress --metrics-out peak.jsonl \
  --plot-out "" >peak.log 2>&1 || { cat peak.log; fail "the one-rank job"; }
grep -q "tensors [0-9.]* MiB peak" peak.log || { cat peak.log; fail "no tensor peak in the step line"; }
measured=$(sed -n 's/.*"step":1,"tensor_peak_bytes":\([0-9]*\).*/\1/p' peak.jsonl)
awk -v p="$planned" -v m="$measured" 'BEGIN { m /= 1048576; d = (p - m) / m; if (d < 0) d = -d;
  if (p == "" || m == 0 || d > 0.02) { print "planned peak " p " MiB, measured " m " MiB"; exit 1 } }' ||
  fail "the plan's peak is not the run's"
echo "ok: the run's tensor peak is the plan's"

# A mixture of experts whose balancing depends on the microbatches says so; without an auxiliary
# loss or a capacity nothing does, and no such note is printed.
plan 0 --model llama-moe-tiny --tp 1 --dp 0 --dp-shard 2 --ep 2 --nproc 2
expect_out "its losses differ slightly from one rank's; --moe-aux-loss-coeff 0"
plan 0 --model llama-moe-tiny --moe-aux-loss-coeff 0 --tp 1 --dp 0 --dp-shard 2 --ep 2 --nproc 2
! grep -q "differ slightly from one rank" out.log || { cat out.log; fail "a note without a cause"; }
echo "ok: the plan says when a mixture of experts' balancing depends on the layout"
