#!/usr/bin/env bash
# A checkpoint folder used in ways no save meant, from the command line: each refused with exit 2
# and one line naming it, before any rank starts (so loomrun --max-restarts has nothing to
# retry), or, for a run already at --steps, a clear word instead of a loss. Found from outside
# (2026-12-07): these had resumed from the wrong step, mixed two runs, or trained other batches.
set -euo pipefail
train="$(realpath "$1")"
loomrun="$(realpath "$2")"
cd "${TEST_TMPDIR:-$(mktemp -d)}"

fail() { echo "FAIL: $*" >&2; exit 1; }
job=("$train" --launcher "$loomrun" --model tiny --dp 1 --tp 1 --batch-size 4 --seq-len 32
  --sample-tokens 0 --no-progress --metrics-out "" --plot-out "")

# refused CASE MESSAGE ARGS...: the job exits 2 with MESSAGE, and no rank started.
refused() {
  local case="$1" message="$2"
  shift 2
  local status=0
  "${job[@]}" "$@" >"$case.log" 2>&1 || status=$?
  [[ $status -eq 2 ]] || { cat "$case.log"; fail "$case: exit $status, expected 2"; }
  grep -qF -- "$message" "$case.log" || { cat "$case.log"; fail "$case: expected: $message"; }
  ! grep -q "^\[rank" "$case.log" || { cat "$case.log"; fail "$case: ranks started"; }
  echo "ok: $case"
}

"${job[@]}" --steps 4 --checkpoint-every 2 --checkpoint-dir ckpt >run.log 2>&1 ||
  { cat run.log; fail "the checkpointing run"; }

refused fresh-run-into-a-used-folder \
  "--checkpoint-dir: 'ckpt' already holds 2 committed step(s) of a run (the latest, step 4" \
  --steps 4 --checkpoint-dir ckpt
refused a-step-folder-as-the-folder \
  "--checkpoint-dir: 'ckpt/step_00000002' is one saved step's folder (it holds metadata.json); give the folder that holds the step_* folders, 'ckpt'" \
  --steps 6 --checkpoint-dir ckpt/step_00000002 --resume

cp -r ckpt renamed && cp -r renamed/step_00000002 renamed/step_00000009
refused a-copied-step-folder \
  "checkpoint: 'renamed/step_00000009' holds step 2 (its COMMITTED and metadata say so), not the step 9 its name says" \
  --steps 10 --checkpoint-dir renamed --resume

refused other-document-boundaries \
  "--document-boundaries false there, true here; --document-token -1 there, 10 here" \
  --steps 6 --checkpoint-dir ckpt --resume --document-boundaries --document-token 10

# What a resume may change on purpose is warned about, each by its flag: the run trains otherwise
# from the saved step on.
cp -r ckpt changed
"${job[@]}" --steps 5 --checkpoint-dir changed --resume --lr 1e-3 --clip 0.5 --dropout 0.1 \
  --attn-dropout 0.05 --mixed-precision bf16 >changed.log 2>&1 || { cat changed.log; fail "a resume with changed settings"; }
for warning in "--steps 5 here, 4 in the saved run" "--lr 0.001 here, 0.003 in the saved run" \
  "--clip 0.5 here, 1.0 in the saved run: the run trains with it from the saved step on" \
  "--dropout 0.1 here, 0.0 in the saved run" "--attn-dropout 0.05 here, 0.0 in the saved run" \
  '--mixed-precision "bf16" here, "none" in the saved run'; do
  grep -qF -- "$warning" changed.log || { cat changed.log; fail "no warning: $warning"; }
done
grep -qF "WARNING: --resume: checkpoint 'changed/step_00000004' holds no state of 2 dropout module(s) (rng/h.0.attn.attn_dropout/calls, rng/h.1.attn.attn_dropout/calls; saved by a model without them" changed.log ||
  { cat changed.log; fail "attention dropout turned on at a resume is not named"; }
echo "ok: a resume's changed training settings are warned about by flag (attention dropout may start)"

# A step under a name no save gives is neither resumed from nor silently skipped (a resume had
# started again at step 0); a new run into such a folder is refused too.
mkdir misnamed && cp -r ckpt/step_00000004 misnamed/step_4
refused a-misnamed-step-folder \
  "--checkpoint-dir: 'misnamed' holds 1 step folder(s) under a name no save gives (misnamed/step_4)" \
  --steps 6 --checkpoint-dir misnamed --resume
refused a-new-run-beside-a-misnamed-step "under a name no save gives (misnamed/step_4)" \
  --steps 6 --checkpoint-dir misnamed

# Two runs' steps in one folder: the newest (another seed) is not resumed from.
"${job[@]}" --steps 6 --checkpoint-every 6 --checkpoint-dir other --seed 7 >other.log 2>&1 ||
  { cat other.log; fail "the second run"; }
cp -r ckpt mixed && cp -r other/step_00000006 mixed/
refused two-runs-in-one-folder \
  "--checkpoint-dir: 'mixed' mixes two runs' steps: step 2 and the latest, step 6, differ in seed 1337 at step 2, 7 at step 6" \
  --steps 8 --checkpoint-dir mixed --resume --seed 7

# A metadata file edited and its marker rewritten to match: what it says is checked against the
# model and against its own step before any rank starts (a resume had skipped a step).
# edit_metadata DIR PERL: applies PERL to DIR's step 4 metadata and rewrites the marker.
edit_metadata() {
  cp -r ckpt "$1"
  local metadata="$1/step_00000004/metadata.json"
  perl -0pi -e "$2" "$metadata"
  printf '{"metadata_sha256":"%s","step":4}\n' "$(sha256sum "$metadata" | cut -d' ' -f1)" \
    >"$1/step_00000004/COMMITTED"
}
edit_metadata trainer_step 's/("trainer": \{\s*"step": )4/${1}5/'
refused an-edited-trainer-step \
  "'trainer_step/step_00000004' records 5 steps done (extra.trainer.step) but was saved as step 4" \
  --steps 6 --checkpoint-dir trainer_step --resume
edit_metadata entry_name 's/"model\/wpe.weight"/"model\/wpe.weights"/'
refused an-edited-entry-name \
  "--resume: checkpoint 'entry_name/step_00000004' does not hold this model's parameters (2 problem(s): 'model/wpe.weight' is missing; 'model/wpe.weights' belongs to no parameter of the model)" \
  --steps 6 --checkpoint-dir entry_name --resume
edit_metadata optim_name 's/"optim\/wpe.weight\/exp_avg"/"optim\/wpe.weight\/exp_avg2"/'
refused an-edited-optimizer-entry \
  "'optim/wpe.weight/exp_avg' is missing; 'optim/wpe.weight/exp_avg2' belongs to no parameter of the model" \
  --steps 6 --checkpoint-dir optim_name --resume

# A damaged byte in the latest step is found as the ranks load it (its checksum): the job fails
# naming it and the committed step a resume could fall back to, exit 2 (damaged on every try: a
# launcher's --max-restarts does not try it again).
cp -r ckpt flipped
size=$(stat -c %s flipped/step_00000004/rank_00000.bin)
byte=$(od -An -tu1 -j $((size / 2)) -N1 flipped/step_00000004/rank_00000.bin | tr -d ' ')
printf "$(printf '\\%03o' $(( byte ^ 1 )))" |
  dd of=flipped/step_00000004/rank_00000.bin bs=1 seek=$((size / 2)) conv=notrunc status=none
status=0
"${job[@]}" --steps 6 --checkpoint-dir flipped --resume >flipped.log 2>&1 || status=$?
[[ $status -eq 2 ]] || { cat flipped.log; fail "a damaged latest step: exit $status, expected 2"; }
grep -q "SHA-256 mismatch, the bytes on disk are not the bytes saved; to resume from the step before it, move 'flipped/step_00000004' out of 'flipped' (the latest committed step is then step 2)" flipped.log ||
  { cat flipped.log; fail "a damaged latest step: the fallback is not named"; }
echo "ok: a damaged byte in the latest step names the step to fall back to"

# A mixture of experts' routing bias is checked with the parameters (it had failed in the ranks).
moe_job=("${job[@]}" --model llama-moe-tiny --n-layer 1 --moe-dense-layers 0)
"${moe_job[@]}" --steps 2 --checkpoint-dir moe >moe.log 2>&1 || { cat moe.log; fail "the MoE run"; }
cp -r moe moe_bias
perl -0pi -e 's/"moe\/layers.0.moe\/expert_bias"/"moe\/layers.0.moe\/expert_biases"/' \
  moe_bias/step_00000002/metadata.json
printf '{"metadata_sha256":"%s","step":2}\n' \
  "$(sha256sum moe_bias/step_00000002/metadata.json | cut -d' ' -f1)" >moe_bias/step_00000002/COMMITTED
job_before=("${job[@]}")
job=("${moe_job[@]}")
refused an-edited-routing-bias \
  "(2 problem(s): 'moe/layers.0.moe/expert_bias' is missing; 'moe/layers.0.moe/expert_biases' belongs to no mixture-of-experts layer of the model)" \
  --steps 4 --checkpoint-dir moe_bias --resume
job=("${job_before[@]}")

# A damaged older step does not stop a resume from a whole latest one: a warning names it.
cp -r ckpt damaged_old && printf ' ' >> damaged_old/step_00000002/metadata.json
"${job[@]}" --steps 6 --checkpoint-dir damaged_old --resume >damaged_old.log 2>&1 ||
  { cat damaged_old.log; fail "a resume beside a damaged older step"; }
grep -q "WARNING: --checkpoint-dir: step 2 is damaged (" damaged_old.log ||
  { cat damaged_old.log; fail "no warning for the damaged older step"; }
# An older step whose rank file is gone: as damaged for a fallback, warned about too.
cp -r ckpt missing_old && rm missing_old/step_00000002/rank_00000.bin
"${job[@]}" --steps 6 --checkpoint-dir missing_old --resume >missing_old.log 2>&1 ||
  { cat missing_old.log; fail "a resume beside an older step missing a rank file"; }
grep -q "WARNING: --checkpoint-dir: step 2 is damaged (.*rank_00000.bin" missing_old.log ||
  { cat missing_old.log; fail "no warning for the older step missing a rank file"; }
echo "ok: a damaged older step (metadata, or a rank file missing) is warned about, the latest resumed"

# A metrics file shared by a folder's runs (the default --metrics-out is one name): a resume keeps
# its own run's earlier lines, and drops another run's rather than taking them as its own.
metrics_job=("$train" --launcher "$loomrun" --model tiny --dp 1 --tp 1 --batch-size 4 --seq-len 32
  --sample-tokens 0 --no-progress --plot-out "" --metrics-out shared.jsonl)
"${metrics_job[@]}" --steps 4 --checkpoint-every 2 --checkpoint-dir shared_ckpt >shared_a.log 2>&1 ||
  { cat shared_a.log; fail "the run that writes shared.jsonl"; }
cp -r shared_ckpt shared_ckpt_again && rm -r shared_ckpt_again/step_00000004
"${metrics_job[@]}" --steps 4 --checkpoint-dir shared_ckpt_again --resume >shared_own.log 2>&1 ||
  { cat shared_own.log; fail "a resume of the run that wrote shared.jsonl"; }
grep -q "shared.jsonl keeps the 2 lines of the steps before 2 from the earlier run" shared_own.log ||
  { cat shared_own.log; fail "a resume did not keep its own run's lines"; }
rm -r shared_ckpt/step_00000004
"${metrics_job[@]}" --steps 3 --seed 9 >shared_b.log 2>&1 || { cat shared_b.log; fail "another run"; }
"${metrics_job[@]}" --steps 4 --checkpoint-dir shared_ckpt --resume >shared_resumed.log 2>&1 ||
  { cat shared_resumed.log; fail "a resume after another run wrote shared.jsonl"; }
grep -q "WARNING: shared.jsonl holds another run's lines (its step 1 logged loss .* where the checkpoint's run logged .*): they are dropped, and the file starts again at step 2" \
  shared_resumed.log || { cat shared_resumed.log; fail "another run's lines were not named"; }
[[ "$(grep -o '"step":[0-9]*' shared.jsonl | tr '\n' ' ')" == '"step":2 "step":3 ' ]] ||
  { cat shared.jsonl; fail "shared.jsonl should hold steps 2 and 3 only"; }
echo "ok: a resume keeps its own run's metrics lines and drops another run's"

# Two jobs saving into one folder would delete each other's unmarked steps: while one holds the
# folder (its .loom-lock), a second is refused before any rank starts; the lock goes with the
# holder, however it ends.
"${job[@]}" --steps 1000000 --checkpoint-every 1000 --checkpoint-dir busy >busy.log 2>&1 &
holder=$!
for _ in $(seq 600); do grep -q "^pid " busy/.loom-lock 2>/dev/null && break; sleep 0.1; done
refused a-folder-another-job-holds "--checkpoint-dir: 'busy' is in use by another job (pid " \
  --steps 4 --checkpoint-dir busy --resume
# Under a launcher that starts the job's ranks itself, rank 0 finds it: exit 2, not restarted.
status=0
"$loomrun" --nproc-per-node 1 --max-restarts 2 -- "$train" --model tiny --dp 1 --tp 1 \
  --batch-size 4 --seq-len 32 --steps 4 --checkpoint-dir busy --resume --sample-tokens 0 \
  --no-progress --metrics-out "" --plot-out "" >busy_rank.log 2>&1 || status=$?
[[ $status -eq 2 ]] || { cat busy_rank.log; fail "a rank finding the folder held exited $status, expected 2"; }
grep -q "is in use by another job" busy_rank.log && grep -q "not restarting" busy_rank.log ||
  { cat busy_rank.log; fail "a rank finding the folder held: not named, or restarted"; }
kill -9 "$holder"; wait "$holder" 2>/dev/null || true
pkill -9 -f -- "--checkpoint-dir busy" 2>/dev/null || true
for _ in $(seq 100); do pgrep -f -- "--checkpoint-dir busy" >/dev/null || break; sleep 0.1; done
"${job[@]}" --steps 1 --checkpoint-dir busy --checkpoint-every 1 >busy_after.log 2>&1 ||
  { cat busy_after.log; fail "the folder stayed locked after its holder was killed"; }
echo "ok: a folder another job holds is refused, and free once that job is gone"

cp -r ckpt truncated && truncate -s 100 truncated/step_00000004/rank_00000.bin
refused a-truncated-rank-file \
  "checkpoint 'truncated/step_00000004': file rank_00000.bin (written by rank 0) has 100 bytes" \
  --steps 6 --checkpoint-dir truncated --resume

"${job[@]}" --steps 4 --checkpoint-dir ckpt --resume >done.log 2>&1 || { cat done.log; fail "a finished run"; }
grep -q "no step to train: the run is at step 4 of --steps 4" done.log || { cat done.log; fail "a finished run"; }
! grep -q "final loss" done.log || { cat done.log; fail "a finished run printed a final loss"; }
echo "ok: a finished run says it has nothing to train"
