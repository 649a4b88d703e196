#!/bin/bash
# The tensor-core attention kernels (tensor/cuda/kernels/flash_attention_mma.cu) on a CPU, for
# when no GPU is at hand: harness.cc runs the .cu file's own kernel code (extract.sh pulls it out
# and instruments its memory accesses) with mma.sync m16n8k16 (from PTX's fragment layouts),
# __shfl_xor_sync and __syncthreads emulated over 128 real threads per block, against a
# double-precision reference. It checks shared memory for races, out-of-bounds and unwritten
# reads, every global load and store against the operands' logical elements (strided layouts:
# contiguous, a GPT's fused QKV, (B, T, H, D) outputs, padded, mixed), outputs written exactly
# once and everything around them untouched. Not hardware: no timing, no real accumulation order
# or exp2f accuracy; the GPU run of cuda_attention_test still decides.
#
#   tools/cuda_emulator/run.sh          # quick: D 16 and 64, every layout, bf16, double-buffered
#                                       # tiles, and D 64 single-buffered (a few minutes)
#   tools/cuda_emulator/run.sh full     # every D, layout, dtype and tile buffering, more sizes
#                                       # (about 90 min on 2 cores)
#   tools/cuda_emulator/mutate.sh NAME 'sed-expr' [harness args]   # a planted defect must fail
#
# Needs g++ (C++20) and the CUDA toolkit's headers (cuda_bf16.h) in /usr/local/cuda/include.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "${here}/../.." && pwd)"
WORK=${WORK:-${TMPDIR:-/tmp}/loom-cuda-emulator}
mkdir -p "${WORK}"
rm -f "${WORK}"/D*.log  # an earlier run's logs are not this one's
"${here}/extract.sh" "${root}/tensor/cuda/kernels/flash_attention_mma.cu" \
  "${root}/tensor/cuda/kernels/flash_attention_tiles.cuh" "${WORK}"
g++ -std=c++20 -O2 -pthread -I/usr/local/cuda/include -I"${root}" -I"${WORK}" \
  "${here}/harness.cc" -o "${WORK}/harness"
failed=0
if [[ "${1:-quick}" == full ]]; then
  for d in 16 32 64 128; do "${WORK}/harness" "${d}" all all 1 all | tee "${WORK}/D${d}.log" | tail -n 3 || failed=1; done
else
  for d in 16 64; do "${WORK}/harness" "${d}" all bf16 0 2 | tee "${WORK}/D${d}.log" | tail -n 3 || failed=1; done
  "${WORK}/harness" 64 all bf16 0 1 | tee "${WORK}/D64_1buf.log" | tail -n 3 || failed=1
fi
cases=$(cat "${WORK}"/D*.log | grep -c '^ok\|^FAIL' || true)
failing=$(cat "${WORK}"/D*.log | grep -c '^FAIL' || true)
echo "cuda_emulator: ${failing} of ${cases} cases failing"
[[ "${failing}" == 0 && "${failed}" == 0 ]]
