#!/usr/bin/env bash
# Distributed checkpoints from the command line: a 2-rank job saves on schedule (keeping the
# last 2), synchronously and asynchronously alike, consolidate turns its last checkpoint into the same Hugging Face file the job's
# --save wrote (byte for byte), and that file seeds a 1-rank job; verify_checkpoint checks one.
set -euo pipefail
train="$(realpath "$1")"
loomrun="$(realpath "$2")"
consolidate="$(realpath "$3")"
verify="$(realpath "$4")"
cd "${TEST_TMPDIR:-$(mktemp -d)}"
mkdir -p saved

"$train" --launcher "$loomrun" --dp 2 --tp 1 --steps 6 --sample-tokens 0 --no-progress \
  --checkpoint-dir ckpt --checkpoint-every 2 --keep-last 2 --save saved/model.safetensors \
  --metrics-out run.jsonl --plot-out run.png > run.log 2>&1 || { cat run.log; exit 1; }
[[ "$(ls ckpt)" == "$(printf 'step_00000004\nstep_00000006')" ]] ||
  { echo "keep-last 2 should leave steps 4 and 6:"; ls ckpt; exit 1; }
grep -q "checkpoint ckpt/step_00000002 committed" run.log || { cat run.log; exit 1; }

# The same job with --async-checkpoint: staged to host memory, committed in the background, the
# same checkpoints (metadata, checksums included, byte for byte).
"$train" --launcher "$loomrun" --dp 2 --tp 1 --steps 6 --sample-tokens 0 --no-progress \
  --checkpoint-dir ckpt_async --checkpoint-every 2 --keep-last 2 --async-checkpoint \
  --metrics-out async.jsonl --plot-out async.png > async.log 2>&1 || { cat async.log; exit 1; }
grep -q "training stalled .* ms (async: staged, committing in the background)" async.log ||
  { cat async.log; exit 1; }
for step in step_00000004 step_00000006; do
  cmp "ckpt/$step/metadata.json" "ckpt_async/$step/metadata.json" ||
    { echo "async and sync checkpoints of $step differ"; exit 1; }
done
grep -q "checkpoint ckpt_async/step_00000006 committed" async.log || { cat async.log; exit 1; }

# verify_checkpoint on the folder checks its latest committed step, and names a step folder no
# save committed (a save cut off), which it passed over.
cp -r ckpt_async ckpt_cut && mv ckpt_cut/step_00000006 ckpt_cut/step_00000008.partial
"$verify" ckpt_cut > verify.log 2>&1 || { cat verify.log; exit 1; }
grep -q "verify_checkpoint: ckpt_cut/step_00000004: .* every checksum matches, and they are the parameters and AdamW state of the model it records" verify.log ||
  { cat verify.log; exit 1; }
grep -q "note: 'ckpt_cut' also holds 1 step folder(s) no save committed (ckpt_cut/step_00000008.partial)" \
  verify.log || { cat verify.log; exit 1; }
# A step whose metadata was edited to fit its files (its marker rewritten: every checksum still
# matches) but not its model: one AdamW state entry gone, and the trainer's step changed.
edited_step() {  # folder, jq filter
  rm -rf "$1" && cp -r ckpt_async "$1"
  local metadata="$1/step_00000006/metadata.json"
  jq -c "$2" "$metadata" > edited.json && mv edited.json "$metadata"
  printf '{"metadata_sha256":"%s","step":6}\n' "$(sha256sum "$metadata" | cut -d' ' -f1)" \
    > "$1/step_00000006/COMMITTED"
}
edited_step ckpt_no_moment 'del(.entries["optim/wte.weight/exp_avg"])'
status=0
"$verify" ckpt_no_moment > verify_edit.log 2>&1 || status=$?
[[ $status -eq 1 ]] || { cat verify_edit.log; echo "an edited checkpoint verified (exit $status)"; exit 1; }
grep -q "verify_checkpoint: checkpoint 'ckpt_no_moment/step_00000006' does not hold this model's parameters (1 problem(s): 'optim/wte.weight/exp_avg' is missing)" \
  verify_edit.log || { cat verify_edit.log; exit 1; }
edited_step ckpt_other_step '.extra.trainer.step = 5'
status=0
"$verify" ckpt_other_step > verify_edit.log 2>&1 || status=$?
[[ $status -eq 1 ]] || { cat verify_edit.log; echo "an edited checkpoint verified (exit $status)"; exit 1; }
grep -q "records 5 steps done (extra.trainer.step) but was saved as step 6" verify_edit.log ||
  { cat verify_edit.log; exit 1; }

# So does consolidate, which writes the latest committed step.
mkdir -p hf_cut
"$consolidate" ckpt_cut hf_cut/model.safetensors > consolidate_cut.log 2>&1 ||
  { cat consolidate_cut.log; exit 1; }
grep -q "consolidate: note: 'ckpt_cut' also holds 1 step folder(s) no save committed (ckpt_cut/step_00000008.partial): consolidating the latest committed step, ckpt_cut/step_00000004" \
  consolidate_cut.log || { cat consolidate_cut.log; exit 1; }

mkdir -p hf
"$consolidate" ckpt hf/model.safetensors > consolidate.log 2>&1 || { cat consolidate.log; exit 1; }
grep -q "ckpt/step_00000006 (step 6) -> hf/model.safetensors" consolidate.log ||
  { cat consolidate.log; exit 1; }
cmp hf/model.safetensors saved/model.safetensors ||
  { echo "the consolidated file differs from the job's own --save"; exit 1; }
grep -q '"model_type": "gpt2"' hf/config.json || { cat hf/config.json; exit 1; }

# As `bazel run //tools/checkpoint:consolidate -- ckpt out.safetensors` runs it: from another
# folder (its runfiles), with BUILD_WORKING_DIRECTORY naming where the relative paths are.
mkdir -p elsewhere hf_run
(cd elsewhere && BUILD_WORKING_DIRECTORY="$OLDPWD" "$consolidate" ckpt hf_run/model.safetensors) \
  > consolidate_run.log 2>&1 || { cat consolidate_run.log; exit 1; }
cmp hf/model.safetensors hf_run/model.safetensors ||
  { echo "consolidate under bazel run's folders wrote another file"; exit 1; }
[[ -z "$(ls elsewhere)" ]] || { echo "consolidate wrote in its own folder: $(ls elsewhere)"; exit 1; }

# An output transformers would not find, or in a folder that does not exist: named before the
# checkpoint is read, as the job's --save is.
status=0; "$consolidate" ckpt hf/model.bin > bin.log 2>&1 || status=$?
[[ $status -eq 2 ]] || { cat bin.log; echo "consolidate to model.bin exited $status, expected 2"; exit 1; }
grep -q "consolidate: output: 'hf/model.bin' is not a .safetensors file name; give the file to write, e.g. 'hf/model.safetensors'" \
  bin.log || { cat bin.log; exit 1; }
status=0; "$consolidate" ckpt nodir/model.safetensors > nodir.log 2>&1 || status=$?
[[ $status -eq 2 ]] || { cat nodir.log; echo "consolidate into a missing folder exited $status"; exit 1; }
grep -q "cannot write 'nodir/model.safetensors': the folder 'nodir' does not exist" nodir.log ||
  { cat nodir.log; exit 1; }

# The consolidated file seeds a 1-rank job (its config.json gives the sizes).
"$train" --dp 1 --tp 1 --steps 1 --sample-tokens 0 --no-progress --init-from hf/model.safetensors \
  --metrics-out seeded.jsonl --plot-out seeded.png > seeded.log 2>&1 || { cat seeded.log; exit 1; }
grep -q "initialized from hf/model.safetensors" seeded.log || { cat seeded.log; exit 1; }

# A Llama job's checkpoint consolidates the same way: the tool rebuilds the family the checkpoint
# recorded, and writes what the job's --save wrote, byte for byte, with its config.json.
mkdir -p saved_llama hf_llama
"$train" --launcher "$loomrun" --model llama-tiny --dp 2 --tp 1 --steps 2 --sample-tokens 0 \
  --no-progress --checkpoint-dir ckpt_llama --save saved_llama/model.safetensors \
  --metrics-out llama.jsonl --plot-out llama.png > llama.log 2>&1 || { cat llama.log; exit 1; }
"$consolidate" ckpt_llama hf_llama/model.safetensors > consolidate_llama.log 2>&1 ||
  { cat consolidate_llama.log; exit 1; }
cmp hf_llama/model.safetensors saved_llama/model.safetensors ||
  { echo "the consolidated Llama differs from the job's own --save"; exit 1; }
cmp hf_llama/config.json saved_llama/config.json || { echo "the Llama config.json differs"; exit 1; }
grep -q '"model_type": "llama"' hf_llama/config.json || { cat hf_llama/config.json; exit 1; }

# --model with --init-from picks the family; a preset of other sizes is named, not taken as the
# model's name (the model trained is the file's).
"$train" --model llama3-8b --dp 1 --tp 1 --steps 1 --sample-tokens 0 --no-progress \
  --init-from hf_llama --metrics-out "" --plot-out "" > other_preset.log 2>&1 ||
  { cat other_preset.log; exit 1; }
grep -q "^loom_train: WARNING: --model llama3-8b: the model is --init-from's (Llama n_layers=2" other_preset.log ||
  { cat other_preset.log; echo "a preset of other sizes than --init-from's was not named"; exit 1; }

# --save over the checkpoint --init-from reads would overwrite the run's own input.
if "$train" --model llama-tiny --dp 1 --tp 1 --steps 1 --no-progress --init-from hf_llama \
    --save hf_llama/model.safetensors --metrics-out "" --plot-out "" > over.log 2>&1; then
  echo "--save over --init-from's file ran"; exit 1
fi
grep -q "^loom_train: --save writes 'hf_llama/model.safetensors', the file --init-from reads" over.log ||
  { cat over.log; exit 1; }
cmp hf_llama/model.safetensors saved_llama/model.safetensors || { echo "the input changed"; exit 1; }

# Bad input is named: not a checkpoint, a missing argument.
if "$consolidate" run.log out.safetensors 2> bad.log; then echo "consolidated a log file"; exit 1; fi
grep -q "is neither a step directory" bad.log || { cat bad.log; exit 1; }
echo "ok: checkpoints on schedule, consolidated byte for byte, seeding a job"
