#!/usr/bin/env bash
# The main job: trains on 1 rank, on dp=2 x tp=2 and on pp=2 x dp=2 x tp=2 (8 ranks, 1F1B over 2
# microbatches), fully sharded on dp_shard=2 x tp=2 and pp=2 x dp_shard=2 x tp=2, through
# loomrun; the loss falls, the
# metrics file has one JSON object per step with the documented fields, changing only the
# parallel layout leaves the losses equal (to f32 rounding: 1e-4 absolute on values ~3-6), the
# same run twice is bit-identical, a saved checkpoint resumes training, and a distributed
# checkpoint resumes exactly (bit-identical on the same layout) on any layout.
set -euo pipefail
train="$(realpath "$1")"
loomrun="$(realpath "$2")"
deepseek_fixture="$(realpath "$3")"
deepseek_fixture="${deepseek_fixture%.safetensors}"
cd "${TEST_TMPDIR:-$(mktemp -d)}"

run() {  # run NAME DP TP STEPS [extra flags]
  local name="$1" dp="$2" tp="$3" steps="$4"
  shift 4
  "$train" --launcher "$loomrun" --dp "$dp" --tp "$tp" --steps "$steps" --log-every 1 --sample-tokens 5 \
    --metrics-out "$name.jsonl" --plot-out "$name.png" "$@" > "$name.log" 2>&1 || { cat "$name.log"; exit 1; }
}
run single 1 1 8
run grid 2 2 8 --save trained.safetensors --checkpoint-dir ckpt --checkpoint-every 4 --keep-last 2
run grid_again 2 2 8
run piped 2 2 8 --pp 2 --microbatches 2 --save piped.safetensors
# The Llama family: llama-tiny on 1 rank and on dp2 x tp2 (its TP plan, GQA, RoPE).
run llama_single 1 1 8 --model llama-tiny
mkdir -p llama_hf
run llama_grid 2 2 8 --model llama-tiny --checkpoint-dir ckpt_llama --checkpoint-every 4 \
  --save llama_hf/model.safetensors
# Llama's pipeline stages composed with dp and tp.
run llama_piped 2 2 8 --model llama-tiny --pp 2 --microbatches 2
# Its Hugging Face export (LlamaForCausalLM, config.json beside it) seeds a 1-rank Llama job, and
# sharded layouts: tp2 (GQA's kv heads split), FSDP over 2, and the default dp2 x tp2.
run llama_seeded 1 1 1 --model llama-tiny --init-from llama_hf/model.safetensors
run llama_seeded_tp 1 2 1 --model llama-tiny --init-from llama_hf/model.safetensors
run llama_seeded_fsdp 0 1 1 --model llama-tiny --dp-shard 2 --init-from llama_hf/model.safetensors
run llama_seeded_grid 2 2 1 --model llama-tiny --init-from llama_hf/model.safetensors
# FSDP (--dp 0: no replicas) composed with TP, and with TP and PP.
run sharded 0 2 8 --dp-shard 2 --save sharded.safetensors
run sharded_piped 0 2 8 --dp-shard 2 --pp 2 --microbatches 2
# A 4-layer model split 1,3 over two stages (--layers-per-stage), against it on one rank.
run single4 1 1 8 --n-layer 4
run split_piped 1 1 8 --n-layer 4 --pp 2 --microbatches 2 --layers-per-stage 1,3
# Exact resume: the grid run's step-4 checkpoint (its step 8 removed) continues for steps 4-7,
# on the same layout (bit-identical losses) and on FSDP x TP and 1 rank (within f32 rounding).
for layout in same sharded single; do
  rm -rf "ckpt_$layout" && cp -r ckpt "ckpt_$layout" && rm -rf "ckpt_$layout/step_00000008"
done
run resumed_same 2 2 8 --checkpoint-dir ckpt_same --resume
run resumed_fsdp 0 2 8 --dp-shard 2 --checkpoint-dir ckpt_sharded --resume
run resumed_single 1 1 8 --checkpoint-dir ckpt_single --resume
# Another model's checkpoint is named, field by field.
if "$train" --dp 1 --tp 1 --n-embd 48 --steps 8 --checkpoint-dir ckpt_same --resume --no-progress \
    --metrics-out other.jsonl --plot-out other.png > other.log 2>&1; then
  echo "a checkpoint of another model config loaded"; exit 1
fi
grep -q "was saved from another model config: n_embd 64 there, 48 here" other.log ||
  { echo "the model mismatch is not named"; cat other.log; exit 1; }
# A MoE's balancing coefficients are training settings: a resume may change them (a warning
# names the change), not what the model is (its top-k).
run moe 1 1 2 --model llama-moe-tiny --checkpoint-dir ckpt_moe --checkpoint-every 2
run moe_resumed 1 1 3 --model llama-moe-tiny --checkpoint-dir ckpt_moe --resume \
  --moe-aux-loss-coeff 0.02
grep -q "WARNING: checkpoint 'ckpt_moe/step_00000002' trained with --moe-aux-loss-coeff 0.01; this run goes on with --moe-aux-loss-coeff 0.02" \
  moe_resumed.log || { echo "the changed coefficient is not named"; cat moe_resumed.log; exit 1; }
# The folder now holds steps of both coefficients: still one run's, which resumes again.
run moe_resumed_again 1 1 4 --model llama-moe-tiny --checkpoint-dir ckpt_moe --resume \
  --moe-aux-loss-coeff 0.02
if "$train" --dp 1 --tp 1 --model llama-moe-tiny --moe-top-k 1 --steps 3 --checkpoint-dir ckpt_moe \
    --resume --no-progress --metrics-out "" --plot-out "" > moe_other.log 2>&1; then
  echo "a MoE checkpoint of another top-k loaded"; exit 1
fi
grep -q "was saved from another model config: moe" moe_other.log ||
  { echo "the MoE mismatch is not named"; cat moe_other.log; exit 1; }
# A Mixtral-routed mixture of experts (every layer, top-2 weights normalized) saves as
# MixtralForCausalLM from expert-parallel ranks, and seeds 1 rank and tp2 alike.
mkdir -p mixtral_hf
run mixtral_ep 0 1 2 --model llama-moe-tiny --moe-dense-layers 0 --moe-route-norm 1 --dp-shard 2 \
  --ep 2 --save mixtral_hf/model.safetensors
grep -q '"model_type": "mixtral"' mixtral_hf/config.json ||
  { echo "no Mixtral config.json"; cat mixtral_hf/config.json; exit 1; }
run mixtral_seeded 1 1 1 --init-from mixtral_hf
run mixtral_seeded_tp 1 2 1 --init-from mixtral_hf
paste <(sed -e 's/.*"loss":\([-0-9.e+]*\).*/\1/' mixtral_seeded.jsonl) \
  <(sed -e 's/.*"loss":\([-0-9.e+]*\).*/\1/' mixtral_seeded_tp.jsonl) | awk '
  { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4) { print "Mixtral seeded: 1 rank " $1 " vs tp2 " $2; bad = 1 } }
  END { if (NR != 1) { print "Mixtral seeded: " NR " steps"; bad = 1 }; exit bad }'
# A DeepSeek-V3 checkpoint (transformers') trains on pp2 x tp2 with its routing bias moving, and
# its save reads back on 1 rank: the bias travels with the stages.
mkdir -p deepseek_in deepseek_out
cp "$deepseek_fixture.safetensors" deepseek_in/model.safetensors
cp "${deepseek_fixture}_config.json" deepseek_in/config.json
run deepseek_piped 1 2 2 --init-from deepseek_in --pp 2 --moe-bias-update-rate 0.01 \
  --save deepseek_out/model.safetensors
grep -q '"model_type": "deepseek_v3"' deepseek_out/config.json ||
  { echo "no DeepSeek-V3 config.json"; cat deepseek_out/config.json; exit 1; }
run deepseek_seeded 1 1 1 --init-from deepseek_out
# A step whose gradient is not finite (a learning rate that blows the weights up) stops the job by
# name before its update, on every rank alike: no NaN parameter, no NaN checkpoint.
status=0
"$train" --launcher "$loomrun" --dp 2 --tp 1 --steps 4 --lr 1e30 --no-progress --metrics-out "" \
  --plot-out "" --checkpoint-dir ckpt_nan --checkpoint-every 1 > nan.log 2>&1 || status=$?
[[ $status -eq 1 ]] || { cat nan.log; echo "a NaN step exited $status, expected 1"; exit 1; }
grep -q "step 1: the gradient norm is -*nan (this rank's loss -*nan): the loss or a gradient is not finite" nan.log ||
  { cat nan.log; echo "the non-finite step is not named"; exit 1; }
[[ "$(ls ckpt_nan)" == "step_00000001" ]] || { ls ckpt_nan; echo "a checkpoint after the NaN step"; exit 1; }
# A mixture of experts stops earlier, at the router of the step after the ruinous update: the
# error names that step too.
status=0
"$train" --model llama-moe-tiny --dp 1 --tp 1 --steps 4 --lr 1e30 --no-progress --metrics-out "" \
  --plot-out "" > moe_nan.log 2>&1 || status=$?
[[ $status -eq 1 ]] || { cat moe_nan.log; echo "a MoE NaN step exited $status, expected 1"; exit 1; }
grep -q "step 1: MoE: token 0's router scores hold a NaN" moe_nan.log ||
  { cat moe_nan.log; echo "the MoE NaN step is not named"; exit 1; }
# A checkpoint written by the dp2 x tp2 job (Hugging Face GPT-2 layout) starts a 1-rank job
# where the first left off: its first loss is far below a fresh model's.
run resumed 1 1 1 --init-from trained.safetensors
# So does one the pipeline wrote (its stages gathered on rank 0), and one FSDP wrote.
run resumed_piped 1 1 1 --init-from piped.safetensors
run resumed_sharded 1 1 1 --init-from sharded.safetensors

python_free_field() {  # field FILE KEY -> values, one per line
  sed -e "s/.*\"$2\":\([-0-9.e+]*\).*/\1/" "$1"
}

[[ $(wc -l < grid.jsonl) -eq 8 ]] || { echo "expected 8 metric lines"; cat grid.jsonl; exit 1; }
for key in step loss lr tokens_per_s ms_per_step peak_mem_bytes; do
  grep -q "\"$key\":" grid.jsonl || { echo "metrics lack $key"; head -1 grid.jsonl; exit 1; }
done
paste <(python_free_field single.jsonl loss) <(python_free_field grid.jsonl loss) | awk '
  { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4) { print "step " NR-1 ": 1 rank " $1 " vs dp2 x tp2 " $2; bad = 1 } }
  NR == 1 { first = $2 } { last = $2 }
  END { if (last >= first) { print "loss did not fall: " first " -> " last; bad = 1 }; exit bad }'
same_losses_as_one_rank() {  # same_losses_as_one_rank NAME LAYOUT
  [[ $(wc -l < "$1.jsonl") -eq 8 ]] || { echo "$2: expected 8 metric lines"; cat "$1.log"; exit 1; }
  paste <(python_free_field single.jsonl loss) <(python_free_field "$1.jsonl" loss) | awk -v layout="$2" '
    { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4) { print "step " NR-1 ": 1 rank " $1 " vs " layout " " $2; bad = 1 } }
    END { exit bad }'
}
same_losses_as_one_rank piped "pp2 x dp2 x tp2"
same_losses_as_one_rank sharded "dp_shard2 x tp2"
same_losses_as_one_rank sharded_piped "pp2 x dp_shard2 x tp2"
paste <(python_free_field single4.jsonl loss) <(python_free_field split_piped.jsonl loss) | awk '
  { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4) { print "step " NR-1 ": 1 rank " $1 " vs pp2 split 1,3 " $2; bad = 1 } }
  END { if (NR != 8) { print "split 1,3: " NR " steps"; bad = 1 }; exit bad }'
# The plan shows the split: stage 0 holds the embeddings and 1 block, stage 1 3 blocks and the head.
"$train" --plan --dp 1 --tp 1 --n-layer 4 --pp 2 --microbatches 2 --layers-per-stage 1,3 > split.plan 2>&1 ||
  { cat split.plan; exit 1; }
[[ $(awk -F'|' '$2 ~ /^ 0 $/ && $3 ~ /^ 0 $/ { print $4 }' split.plan | head -1) -lt \
   $(awk -F'|' '$2 ~ /^ 1 $/ && $3 ~ /^ 1 $/ { print $4 }' split.plan | head -1) ]] ||
  { cat split.plan; echo "the 1,3 split does not put more on stage 1"; exit 1; }
for layout in "llama_grid dp2 x tp2" "llama_piped pp2 x dp2 x tp2"; do
  paste <(python_free_field llama_single.jsonl loss) <(python_free_field "${layout%% *}.jsonl" loss) |
    awk -v layout="${layout#* }" '
    { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4) { print "llama step " NR-1 ": 1 rank " $1 " vs " layout " " $2; bad = 1 } }
    NR == 1 { first = $2 } { last = $2 }
    END { if (NR == 0) { print "no llama losses for " layout; bad = 1 }
          if (last >= first) { print "llama loss did not fall under " layout ": " first " -> " last; bad = 1 }; exit bad }'
done
grep -q "params, llama-tiny on" llama_grid.log || { echo "no llama run"; cat llama_grid.log; exit 1; }
llama_fresh=$(python_free_field llama_single.jsonl loss | head -1)
llama_seeded=$(python_free_field llama_seeded.jsonl loss | head -1)
awk -v f="$llama_fresh" -v s="$llama_seeded" 'BEGIN { exit !(s < f - 0.5) }' ||
  { echo "the exported Llama seeds at loss $llama_seeded, a fresh one starts at $llama_fresh"; exit 1; }
for seeded in llama_seeded_tp llama_seeded_fsdp llama_seeded_grid; do
  awk -v a="$llama_seeded" -v b="$(python_free_field "$seeded.jsonl" loss | head -1)" -v run="$seeded" \
    'BEGIN { d = a - b; if (d < 0) d = -d; if (d > 1e-4) { print run " starts at " b ", 1 rank at " a; exit 1 } }'
done
grep -q "dp_shard=2" sharded.log || { echo "the FSDP run's mesh has no dp_shard=2"; cat sharded.log; exit 1; }
[[ -f ckpt/step_00000004/COMMITTED && -f ckpt/step_00000008/COMMITTED ]] ||
  { echo "the grid run did not commit steps 4 and 8"; ls -R ckpt; cat grid.log; exit 1; }
grep -q "resumed from ckpt_same/step_00000004 at step 4 (same layout)" resumed_same.log ||
  { echo "no resume line"; cat resumed_same.log; exit 1; }
grep -q "resumed from ckpt_sharded/step_00000004 at step 4 (saved on DeviceMesh(pp=1, dp_replicate=2, dp_shard=1, cp=1, tp=2, cpu), now DeviceMesh(pp=1, dp_replicate=1, dp_shard=2, cp=1, tp=2, cpu))" resumed_fsdp.log ||
  { echo "the layout change is not said"; cat resumed_fsdp.log; exit 1; }
if ! diff <(python_free_field grid.jsonl loss | tail -4) <(python_free_field resumed_same.jsonl loss) > /dev/null; then
  echo "the resumed run's losses are not bit-identical to the uninterrupted run's:"
  paste <(python_free_field grid.jsonl loss | tail -4) <(python_free_field resumed_same.jsonl loss)
  exit 1
fi
for resumed in resumed_fsdp resumed_single; do
  [[ $(wc -l < "$resumed.jsonl") -eq 4 ]] || { echo "$resumed: expected steps 4-7"; cat "$resumed.log"; exit 1; }
  paste <(python_free_field grid.jsonl loss | tail -4) <(python_free_field "$resumed.jsonl" loss) | awk -v run="$resumed" '
    { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4) { print run ": step " NR+3 ": " $1 " vs " $2; bad = 1 } }
    END { exit bad }'
done
# Determinism: the same job twice gives bit-identical losses (Gloo reduces in rank order).
if ! diff <(python_free_field grid.jsonl loss) <(python_free_field grid_again.jsonl loss) > /dev/null; then
  echo "two identical dp2 x tp2 runs gave different losses:"
  paste <(python_free_field grid.jsonl loss) <(python_free_field grid_again.jsonl loss)
  exit 1
fi
fresh=$(python_free_field single.jsonl loss | head -1)
resumed=$(python_free_field resumed.jsonl loss | head -1)
awk -v f="$fresh" -v r="$resumed" 'BEGIN { exit !(r < f - 0.5) }' || { echo "resumed loss $resumed is not below fresh $fresh"; exit 1; }
resumed_piped=$(python_free_field resumed_piped.jsonl loss | head -1)
awk -v p="$resumed_piped" -v r="$resumed" 'BEGIN { d = p - r; if (d < 0) d = -d; exit !(d < 1e-4) }' ||
  { echo "the pipeline's checkpoint resumes at loss $resumed_piped, the dp2 x tp2 one at $resumed"; exit 1; }
resumed_sharded=$(python_free_field resumed_sharded.jsonl loss | head -1)
awk -v s="$resumed_sharded" -v r="$resumed" 'BEGIN { d = s - r; if (d < 0) d = -d; exit !(d < 1e-4) }' ||
  { echo "the FSDP run's checkpoint resumes at loss $resumed_sharded, the dp2 x tp2 one at $resumed"; exit 1; }
grep -q "loss curve: grid.png" grid.log || { echo "no loss curve"; cat grid.log; exit 1; }
grep -q "sample:" grid.log || { echo "no sample"; exit 1; }
grep -q "sample:" piped.log || { echo "no sample from the pipeline"; cat piped.log; exit 1; }
# Another run's checkpoint is refused by name before anything trains (exit 2): other seed.
if "$train" --dp 2 --tp 2 --steps 8 --seed 7 --checkpoint-dir ckpt --resume --no-progress \
    --metrics-out seed.jsonl --plot-out seed.png > seed.log 2>&1; then
  echo "a checkpoint of another run (seed) resumed"; exit 1
fi
grep -q "checkpoint 'ckpt/step_00000008' was saved by another run: --seed 1337 there, 7 here" seed.log ||
  { echo "the run mismatch is not named"; cat seed.log; exit 1; }
# A step folder no save committed is said loudly before training resumes from the committed one.
rm -rf ckpt_lost && cp -r ckpt ckpt_lost && rm ckpt_lost/step_00000008/COMMITTED
run lost 2 2 8 --checkpoint-dir ckpt_lost --resume
grep -q "WARNING: --checkpoint-dir 'ckpt_lost' holds 1 step folder(s) no save committed (ckpt_lost/step_00000008), resuming from the latest committed step 4" lost.log ||
  { echo "the uncommitted step is not warned about"; cat lost.log; exit 1; }
echo "ok: losses equal across layouts and falling"
