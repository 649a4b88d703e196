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

cp -r ckpt truncated && truncate -s 100 truncated/step_00000004/rank_00000.bin
refused a-truncated-rank-file \
  "checkpoint 'truncated/step_00000004': file rank_00000.bin (written by rank 0) has 100 bytes" \
  --steps 6 --checkpoint-dir truncated --resume

"${job[@]}" --steps 4 --checkpoint-dir ckpt --resume >done.log 2>&1 || { cat done.log; fail "a finished run"; }
grep -q "no step to train: the run is at step 4 of --steps 4" done.log || { cat done.log; fail "a finished run"; }
! grep -q "final loss" done.log || { cat done.log; fail "a finished run printed a final loss"; }
echo "ok: a finished run says it has nothing to train"
