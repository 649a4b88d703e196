#!/usr/bin/env bash
# The README's example of a user's own job (examples/my_job.cc: its settings in code, the library's
# runner, checkpoints and resume switched on) on 4 ranks (dp=2 x tp=2) and on 1: the loss falls
# and ends the same on both (the layout leaves the math unchanged), and a run stopped after a
# checkpoint resumes where it stopped, bit for bit.
set -euo pipefail
job="$(realpath "$1")"
loomrun="$(realpath "$2")"
cd "${TEST_TMPDIR:-$(mktemp -d)}"

fail() { echo "FAIL: $*" >&2; exit 1; }
run() {  # run NAME RANKS DIR
  timeout 300 "$loomrun" --nproc-per-node "$2" -- "$job" "$3" >"$1.log" 2>&1 ||
    { cat "$1.log"; fail "my_job failed on $2 ranks"; }
  grep 'loss .* ->' "$1.log" || { cat "$1.log"; fail "$1: no loss line"; }
}
final() { sed -n 's/.*-> \([0-9.]*\)$/\1/p' "$1.log"; }
first() { sed -n 's/.*loss \([0-9.]*\) ->.*/\1/p' "$1.log"; }

run four 4 ckpt4
run one 1 ckpt1
grep -q 'dp_replicate=2 x tp=2' four.log || { cat four.log; fail "4 ranks should be dp_replicate=2 x tp=2"; }
awk -v a="$(final four)" -v b="$(first four)" 'BEGIN { if (a >= b) { print "the loss did not fall: " b " -> " a; exit 1 } }'
# Printed to 1e-4; f32 rounding between layouts is far below that.
awk -v a="$(final four)" -v b="$(final one)" 'BEGIN { d = a - b; if (d < 0) d = -d;
  if (d > 2e-4) { print "final loss " a " on 4 ranks vs " b " on 1"; exit 1 } }'
# Checkpoints every 10 steps: drop the last two, and the same program resumes at step 10.
[[ -d ckpt4/step_00000030 && -d ckpt4/step_00000010 ]] || { ls ckpt4; fail "no checkpoints"; }
rm -rf ckpt4/step_00000030 ckpt4/step_00000020
run resumed 4 ckpt4
grep -q 'resumed from ckpt4/step_00000010 at step 10 (same layout)' resumed.log ||
  { cat resumed.log; fail "did not resume from step 10"; }
grep -q 'steps 10..29' resumed.log || { cat resumed.log; fail "resumed the wrong steps"; }
[[ "$(final resumed)" == "$(final four)" ]] ||
  fail "resumed to $(final resumed), the uninterrupted run reached $(final four)"
echo "ok: a user's job on 4 ranks and 1, checkpointed and resumed"
