#!/usr/bin/env bash
# A sample of the checkpoint fault tools, in CI: 3 trials of killing a rank of a checkpointing
# job at a random moment (the latest committed step must verify and resume), and 60 damaged
# copies of a checkpoint (flipped bits, truncations, deletions: all must be detected).
# The full runs are tools: bazel run //tools/checkpoint:kill_during_save -- 50 and
# bazel run //tools/checkpoint:mutation_trials -- --trials 1000.
set -euo pipefail
export TRAIN_GPT="$(realpath "$1")" LOOMRUN="$(realpath "$2")" VERIFY_CHECKPOINT="$(realpath "$3")"
kill_during_save="$(realpath "$4")"
mutation_trials="$(realpath "$5")"
bash "$kill_during_save" 3
"$mutation_trials" --trials 60 --work-dir "${TEST_TMPDIR:-$(mktemp -d)}/mutations"
echo "ok: kills leave a loadable checkpoint; every damage is detected"
