#!/usr/bin/env bash
# The main job: trains on 1 rank, on dp=2 x tp=2 and on pp=2 x dp=2 x tp=2 (8 ranks, 1F1B over 2
# microbatches), fully sharded on dp_shard=2 x tp=2 and pp=2 x dp_shard=2 x tp=2, through
# loomrun; the loss falls, the
# metrics file has one JSON object per step with the documented fields, changing only the
# parallel layout leaves the losses equal (to f32 rounding: 1e-4 absolute on values ~3-6), the
# same run twice is bit-identical, and a saved checkpoint resumes training.
set -euo pipefail
train="$(realpath "$1")"
loomrun="$(realpath "$2")"
cd "${TEST_TMPDIR:-$(mktemp -d)}"

run() {  # run NAME DP TP STEPS [extra flags]
  local name="$1" dp="$2" tp="$3" steps="$4"
  shift 4
  "$train" --launcher "$loomrun" --dp "$dp" --tp "$tp" --steps "$steps" --log-every 1 --sample-tokens 5 \
    --metrics-out "$name.jsonl" --plot-out "$name.png" "$@" > "$name.log" 2>&1 || { cat "$name.log"; exit 1; }
}
run single 1 1 8
run grid 2 2 8 --save trained.safetensors
run grid_again 2 2 8
run piped 2 2 8 --pp 2 --microbatches 2 --save piped.safetensors
# FSDP (--dp 0: no replicas) composed with TP, and with TP and PP.
run sharded 0 2 8 --dp-shard 2 --save sharded.safetensors
run sharded_piped 0 2 8 --dp-shard 2 --pp 2 --microbatches 2
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
grep -q "dp_shard=2" sharded.log || { echo "the FSDP run's mesh has no dp_shard=2"; cat sharded.log; exit 1; }
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
echo "ok: losses equal across layouts and falling"
