#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU (sized for 1 H200 and 16 cores, about 5 minutes),
# builds what the GPU path needs with bazel -c opt, runs every test tagged "cuda" (which skip
# their GPU cases elsewhere, so here they must really run), then prints the figures:
#   1. bf16 GEMM TFLOP/s through cuBLASLt at 4096^3 and 8192x8192x2048 beside the dense peak;
#   2. an NCCL world of size 1 running every collective (tests/comm/nccl_test SingleRankTest.*).
# Usage: tools/gpu_check.sh [--peak TFLOPS]   (default 989, H100/H200 SXM dense bf16)
set -euo pipefail

peak=989
if [[ "${1:-}" == "--peak" ]]; then peak="$2"; fi

cd "$(dirname "$0")/.."
start=$(date +%s)

section() {
  echo
  echo "==== $1 ($(( $(date +%s) - start )) s) ===="
}

fail() {
  echo "gpu_check: $*" >&2
  exit 1
}

section "GPU"
command -v nvidia-smi >/dev/null 2>&1 ||
  fail "no NVIDIA driver on this machine (nvidia-smi not found); run this on a GPU machine"
nvidia-smi -L >/dev/null 2>&1 || fail "nvidia-smi found no usable GPU: $(nvidia-smi -L 2>&1 | head -1)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

jobs=$(nproc)
section "build (bazel -c opt, ${jobs} jobs)"
targets=(//tools/bench:cuda_gemm_bench //tests/tensor/... //tests/comm:nccl_test)
bazel build -c opt --jobs="${jobs}" "${targets[@]}"

section "GPU tests (bazel test --test_tag_filters=cuda)"
bazel test -c opt --jobs="${jobs}" --local_test_jobs=4 --test_tag_filters=cuda \
  --test_output=errors //tests/tensor/... //tests/comm:nccl_test
# On one GPU only the no-GPU error cases and the two-GPU cases may skip; anything else skipping
# means a GPU case did not run: named here (a warning, so the figures below still print).
skipped=$(grep -h "SKIPPED \] [A-Za-z]" bazel-testlogs/tests/tensor/cuda_*/test.log \
  bazel-testlogs/tests/comm/nccl_test/test.log 2>/dev/null |
  grep -v -e NoGpu -e AllocatingWithoutAGpu -e TwoRank || true)
if [[ -n "${skipped}" ]]; then
  echo "WARNING: these GPU test cases skipped on a GPU machine (logs under bazel-testlogs/):"
  echo "${skipped}"
else
  echo "every single-GPU test case ran"
fi

section "bf16 GEMM through cuBLASLt (dense peak ${peak} TFLOP/s)"
bazel-bin/tools/bench/cuda_gemm_bench --peak "${peak}"

section "NCCL world of size 1: every collective"
bazel-bin/tests/comm/nccl_test --gtest_filter='SingleRankTest.*' --gtest_brief=1

section "done"
echo "gpu_check passed in $(( $(date +%s) - start )) s"
