#!/bin/bash
# The GPU check's tests on the emulated CUDA device (device/README.md), for a machine without a
# GPU: every `test` line of tools/gpu_binaries.txt, built with --config=cuda_emulated, except
# what needs NCCL, which cannot run without a GPU (nccl_test, and gpt_cuda_equivalence_test's
# one-GPU case, a world of one NCCL rank). A case skipped for want of a GPU is reported: under the
# emulator only the multi-GPU cases may skip.
#
#   tools/cuda_emulator/emulated_tests.sh [extra bazel test flags]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "${root}"
mapfile -t targets < <(awk '$1 == "test" && $2 !~ /nccl/ {
  n = split($2, parts, "/"); path = $2; sub("/" parts[n] "$", "", path); print "//" path ":" parts[n] }' \
  tools/gpu_binaries.txt)
echo "emulated GPU tests: ${targets[*]}"
status=0
bazel test --config=cuda_emulated --test_timeout=3600 \
  --test_arg=--gtest_filter=-GPTCudaEquivalenceTest.OneGpuRunsTheWholeStepAsOneCpuRank \
  "$@" "${targets[@]}" || status=$?
for target in "${targets[@]}"; do
  path="${target#//}"
  log="bazel-testlogs/${path/://}/test.log"
  [[ -f "${log}" ]] || continue
  ran=$(grep -c '^\[       OK \]' "${log}" || true)
  skipped=$(grep '^\[  SKIPPED \] [A-Za-z]' "${log}" | sed 's/ ([0-9]* ms)$//' | sort -u |
    grep -v -e NoGpu -e CpuOnlyBuild -e AllocatingWithoutAGpu -e Gpus -e TwoGpus || true)
  echo "${target}: ${ran} cases passed${skipped:+; skipped:}"
  [[ -n "${skipped}" ]] && echo "${skipped}"
done
exit "${status}"
