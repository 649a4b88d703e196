#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU (sized for 1 H200 and 16 cores, about 5 minutes),
# runs every GPU test (tools/gpu_binaries.txt; their GPU cases must really run here), then prints
# the figures:
#   1. bf16 GEMM TFLOP/s through cuBLASLt at 4096^3 and 8192x8192x2048 beside the dense peak;
#      fused attention forward and backward TFLOP/s (bf16, causal, T 1024 and 4096, D 64 and
#      128) on the tensor-core kernels and the plain ones;
#   2. training on one GPU in bf16 mixed precision: GPT-2 small (124M) at batch 64 x 1024 and
#      16 x 1024 and a Llama of 122M (GPT-2 small's shape, SwiGLU, GQA, 32000 vocabulary) at 16 x 1024:
#      tokens/s, MFU ((6 N + 12 L C T) FLOPs per token x tokens/s over the peak), peak memory;
#      then GPT-2 small's step as traced (host time, bytes by op) and its op table as run, and
#      PyTorch eager and torch.compile on the same
#      step where the machine has PyTorch with CUDA (Loom's step over theirs);
#   3. an NCCL world of size 1 running every collective (tests/comm/nccl_test SingleRankTest.*);
#   4. determinism: the same small GPU job twice, its losses compared bit for bit.
# The GPU tests include tests/models/gpt_cuda_equivalence_test: 4 training steps of a tiny GPT on
# the GPU (DDP over an NCCL world of 1) against one CPU rank (its 2- and 8-GPU cases need more GPUs),
# and tests/models/bf16_training_test: 10 bf16 steps of GPT and Llama on the GPU, as one rank and as
# dp2 x tp2 + SP, dp_shard 2 and pp2 ranks sharing it, against one CPU rank's losses.
#
# Two ways to get the binaries:
#   tools/gpu_check.sh [--peak TFLOPS]
#       builds them here with bazel -c opt (needs Bazel and the Debian packages: ./loom setup);
#   tools/gpu_check.sh --prebuilt DIR [--peak TFLOPS]
#       runs the bundle tools/gpu_bundle.sh made in DIR on another machine: what the lent GPU
#       machine needs, since it has no Bazel, no Debian packages and no network. NCCL and
#       cuBLASLt come from that machine (PyTorch's wheels or the CUDA toolkit).
# --peak: the dense bf16 peak in TFLOP/s (default 989, H100/H200 SXM).
set -euo pipefail

peak=989
prebuilt=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --peak) peak="$2"; shift 2 ;;
    --prebuilt) prebuilt="$2"; shift 2 ;;
    *) echo "gpu_check: unknown argument '$1' (expected --peak TFLOPS or --prebuilt DIR)" >&2; exit 2 ;;
  esac
done

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

# The directory holding the first `name` found where CUDA's toolkit or Python wheels put it.
find_library_dir() {
  local name="$1" found=""
  for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
    if [[ -e "${dir}/${name}" ]]; then found="${dir}/${name}"; break; fi
  done
  [[ -n "${found}" ]] || found=$(find /opt /usr -name "${name}" -print -quit 2>/dev/null || true)
  [[ -n "${found}" ]] || fail "no ${name} on this machine (looked in CUDA's lib64, /usr and /opt)"
  dirname "${found}"
}

section "GPU"
command -v nvidia-smi >/dev/null 2>&1 ||
  fail "no NVIDIA driver on this machine (nvidia-smi not found); run this on a GPU machine"
nvidia-smi -L >/dev/null 2>&1 || fail "nvidia-smi found no usable GPU: $(nvidia-smi -L 2>&1 | head -1)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

mapfile -t tests < <(awk '$1 == "test" { print $2 }' tools/gpu_binaries.txt)
if [[ -n "${prebuilt}" ]]; then
  section "unpack ${prebuilt}/loom-gpu.tar.xz (tools/gpu_bundle.sh)"
  root=$(mktemp -d)
  tar -C "${root}" -xJf "${prebuilt}/loom-gpu.tar.xz"
  echo "built from commit $(cat "${root}/commit"); this tree is at $(git rev-parse HEAD 2>/dev/null || echo '?')"
  bin="${root}/bin"
  nccl_dir=$(find_library_dir libnccl.so.2)
  cublaslt_dir=$(find_library_dir libcublasLt.so.13)
  echo "NCCL from ${nccl_dir}, cuBLASLt from ${cublaslt_dir}"
  export LD_LIBRARY_PATH="${root}/lib:${nccl_dir}:${cublaslt_dir}${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
else
  ./loom setup  # the Debian packages the build needs (quiet when all are there)
  jobs=$(nproc)
  section "build (bazel -c opt, ${jobs} jobs)"
  targets=()
  while read -r kind path; do
    [[ "${kind}" == test || "${kind}" == program ]] && targets+=("//${path%/*}:${path##*/}")
  done < tools/gpu_binaries.txt
  bazel build -c opt --jobs="${jobs}" "${targets[@]}"
  bin=bazel-bin
fi

section "GPU tests (${#tests[@]} binaries)"
# Each test binary runs as it is; a failure is reported, not fatal, so the figures still print.
logs=$(mktemp -d)
failed=()
for t in "${tests[@]}"; do
  name=$(basename "${t}")
  if "${bin}/${t}" >"${logs}/${name}.log" 2>&1; then
    echo "PASSED  ${t}  ($(grep -c '^\[       OK \]' "${logs}/${name}.log") cases ran)"
  else
    failed+=("${t}")
    echo "FAILED  ${t}; the end of its output:"
    tail -n 30 "${logs}/${name}.log"
  fi
done
# On one GPU only the no-GPU error cases and the multi-GPU cases may skip; anything else skipping
# means a GPU case did not run: named here (a warning, so the figures below still print).
skipped=$(cat "${logs}"/*.log | grep "SKIPPED \] [A-Za-z]" | sed 's/ ([0-9]* ms)$//' | sort -u |
  grep -v -e NoGpu -e CpuOnlyBuild -e AllocatingWithoutAGpu -e TwoRank -e OnTwoGpus -e OnEightGpus || true)
if [[ -n "${skipped}" ]]; then
  echo "WARNING: these GPU test cases skipped on a GPU machine:"
  echo "${skipped}"
else
  echo "every single-GPU test case ran"
fi
[[ ${#failed[@]} -eq 0 ]] || echo "WARNING: ${#failed[@]} GPU test binaries failed: ${failed[*]}"
# Where the tensor-core attention kernels fail here, the training figures below run on the plain
# attention kernels (LOOM_TENSOR_CORE_ATTENTION=0), so the rest of the step is still measured.
if [[ " ${failed[*]} " == *" tests/tensor/cuda_attention_test "* ]]; then
  export LOOM_TENSOR_CORE_ATTENTION=0
  echo "WARNING: cuda_attention_test failed: the training figures below use the plain attention kernels (LOOM_TENSOR_CORE_ATTENTION=0)"
fi

# Each figure is tried even when one before it failed; the failures are counted for the end.
problems=${#failed[@]}

section "bf16 GEMM through cuBLASLt (dense peak ${peak} TFLOP/s)"
"${bin}/tools/bench/cuda_gemm_bench" --peak "${peak}" || { echo "WARNING: cuda_gemm_bench failed"; problems=$((problems + 1)); }

section "Fused attention, bf16, causal: tensor-core kernels beside the plain ones"
"${bin}/tools/bench/cuda_attention_bench" || { echo "WARNING: cuda_attention_bench failed"; problems=$((problems + 1)); }

work=$(mktemp -d)
# GPT-2-tokenized data without a download: random token ids in llm.c/nanoGPT's raw uint16 format
# (the loss stays near ln(vocab); this measures speed, not learning). perl is in every Debian.
perl -e 'srand(1); print pack("v*", map { int(rand(50257)) } 1 .. 4000000)' > "${work}/tokens.bin"
perl -e 'srand(2); print pack("v*", map { int(rand(32000)) } 1 .. 4000000)' > "${work}/tokens32k.bin"
steps=12

# One training figure: `train_figure NAME DATA FLAGS...` runs loom_train on one GPU in bf16 mixed
# precision for ${steps} steps and prints tokens/s (the median over steps 2..: step 0 builds
# cuBLASLt plans and fills the allocator), TFLOP/s, MFU ((6 N + 12 L C T) FLOPs per token over
# the peak; every model here has L 12, C 768, T 1024) and peak memory. Sets loom_tokens_per_s.
loom_tokens_per_s=""
train_figure() {
  local name="$1" data="$2"
  shift 2
  if "${bin}/examples/loom_train" --device cuda --dp 1 --tp 1 --seq-len 1024 --steps "${steps}" \
    --log-every 1 --mixed-precision bf16 --data "${data}" --sample-tokens 1 \
    --metrics-out "${work}/${name}.jsonl" --plot-out "${work}/${name}.png" --no-progress "$@" \
    > "${work}/${name}.log" 2>&1; then
    local params median memory
    params=$(sed -n 's/.*loom_train: \([0-9]*\) params.*/\1/p' "${work}/${name}.log" | head -1)
    median=$(sed -n 's/.*"tokens_per_s":\([0-9.e+]*\).*/\1/p' "${work}/${name}.jsonl" | tail -n +3 |
      sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
    memory=$(sed -n 's/.*"peak_mem_bytes":\([0-9]*\).*/\1/p' "${work}/${name}.jsonl" | tail -1)
    loom_tokens_per_s="${median}"
    awk -v name="${name}" -v params="${params}" -v rate="${median}" -v peak="${peak}" \
      -v memory="${memory}" -v layers=12 -v width=768 -v seq=1024 'BEGIN {
        flops = 6 * params + 12 * layers * width * seq  # per token, forward + backward (nanoGPT/PaLM)
        printf "%s: %d params; tokens/s %.0f (median, steps 2..); %.1f TFLOP/s; MFU %.1f%% of %d TFLOP/s; peak memory %.2f GiB\n",
          name, params, rate, rate * flops / 1e12, 100 * rate * flops / (peak * 1e12), peak, memory / 2^30
      }'
    # The caching allocator's cudaMalloc count after step 1 and after the last: equal when the
    # cache serves every tensor of a step, growing when the step calls cudaMalloc.
    grep 'allocator: ' "${work}/${name}.log" | sed -n '2p;$p' | sed "s/^ *allocator: /  ${name} allocator: /"
  else
    tail -n 20 "${work}/${name}.log"
    echo "WARNING: the ${name} training run failed"
    problems=$((problems + 1))
    # Once more on the plain attention kernels, in case the tensor-core ones are what failed.
    if [[ "${LOOM_TENSOR_CORE_ATTENTION:-1}" != 0 ]]; then
      echo "${name}: again on the plain attention kernels (LOOM_TENSOR_CORE_ATTENTION=0)"
      LOOM_TENSOR_CORE_ATTENTION=0 train_figure "${name}-plain-attention" "${data}" "$@"
    fi
  fi
}

section "Training on one GPU: bf16 compute over f32 master weights, 1024 tokens per sequence"
train_figure gpt2-small-b64 "${work}/tokens.bin" --model small --batch-size 64
# Llama of about 125M parameters (122M): GPT-2 small's depth and width, SwiGLU 2048, llama-tiny's
# grouped-query attention (2 key/value heads), a 32000 vocabulary.
train_figure llama-122m-b16 "${work}/tokens32k.bin" --model llama-tiny --n-layer 12 --n-embd 768 \
  --n-head 12 --ffn-dim 2048 --vocab-size 32000 --block-size 1024 --batch-size 16
train_figure gpt2-small-b16 "${work}/tokens.bin" --model small --batch-size 16
gpt2_b16_tokens_per_s="${loom_tokens_per_s}"

section "Determinism: the same GPU job twice, the same losses bit for bit"
# No CUDA kernel adds with atomics (the embedding's backward sorts its indices), so a GPU job
# repeats exactly: what bitwise resume on a GPU rests on.
for run in 1 2; do
  "${bin}/examples/loom_train" --device cuda --dp 1 --tp 1 --model small --batch-size 4 --seq-len 256 \
    --steps 4 --log-every 1 --mixed-precision bf16 --data "${work}/tokens.bin" --sample-tokens 0 \
    --metrics-out "${work}/repeat${run}.jsonl" --plot-out "" --no-progress > "${work}/repeat${run}.log" 2>&1 ||
    { tail -n 10 "${work}/repeat${run}.log"; echo "WARNING: determinism run ${run} failed"; problems=$((problems + 1)); }
done
losses() { sed -n 's/.*"loss":\([-0-9.e+]*\).*/\1/p' "$1"; }
if cmp -s <(losses "${work}/repeat1.jsonl") <(losses "${work}/repeat2.jsonl"); then
  echo "two runs of GPT-2 small (4 steps, 4 x 256, bf16): the same losses bit for bit: $(losses "${work}/repeat1.jsonl" | tr '\n' ' ')"
else
  paste <(losses "${work}/repeat1.jsonl") <(losses "${work}/repeat2.jsonl")
  echo "WARNING: two runs of the same GPU job differ (above)"
  problems=$((problems + 1))
fi

section "GPT-2 small, batch 16 x 1024: the step as traced (no kernel runs), for the op table below"
# The host's time to issue the step and its memory traffic by op (tools/bench/host_step_bench.cc):
# what the op table's memory-bound rows should cost at this GPU's bandwidth.
"${bin}/tools/bench/host_step_bench" --model small --batch-size 16 --seq-len 1024 \
  --mixed-precision bf16 --dp 1 --tp 1 --repeats 3 ||
  { echo "WARNING: host_step_bench failed"; problems=$((problems + 1)); }

section "GPT-2 small, batch 16 x 1024: where the step goes (every op waits for its kernels)"
# Per op and input shapes (LOOM_PROFILE=ops,shapes, base/profiler.h), over steps 1..2.
if LOOM_PROFILE=ops,shapes "${bin}/examples/loom_train" --device cuda --dp 1 --tp 1 --model small \
  --batch-size 16 --seq-len 1024 --steps 3 --mixed-precision bf16 --data "${work}/tokens.bin" \
  --no-progress --profile-ops > "${work}/profile.log" 2>&1; then
  sed -n '/op times on rank 0/,$p' "${work}/profile.log"
else
  tail -n 20 "${work}/profile.log"
  echo "WARNING: the profiled run failed"
  problems=$((problems + 1))
fi

section "PyTorch on the same GPU: GPT-2 small, batch 16 x 1024, bf16 autocast, SDPA, fused AdamW"
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  for mode in eager compile; do
    flag=""
    [[ "${mode}" == compile ]] && flag="--compile"
    if line=$(timeout 600 python3 tools/bench/pytorch/workloads.py cuda-train --batch-size 16 ${flag} 2>"${work}/torch-${mode}.err" |
      sed -n 's/^RESULT //p'); [[ -n "${line}" ]]; then
      torch_rate=$(echo "${line}" | sed -n 's/.*"tokens_per_s": \([0-9.e+]*\).*/\1/p')
      echo "PyTorch ${mode}: ${line}"
      [[ -n "${gpt2_b16_tokens_per_s}" ]] && awk -v loom="${gpt2_b16_tokens_per_s}" -v torch="${torch_rate}" \
        -v mode="${mode}" 'BEGIN { printf "Loom step / PyTorch %s step: %.2f\n", mode, torch / loom }'
    else
      tail -n 5 "${work}/torch-${mode}.err"
      echo "PyTorch ${mode}: did not run (above)"
    fi
  done
else
  echo "no PyTorch with CUDA on this machine: skipped"
fi

section "NCCL world of size 1: every collective"
"${bin}/tests/comm/nccl_test" --gtest_filter='SingleRankTest.*' --gtest_brief=1 ||
  { echo "WARNING: the NCCL world of 1 failed"; problems=$((problems + 1)); }

section "done"
if [[ ${problems} -eq 0 ]]; then
  echo "gpu_check passed in $(( $(date +%s) - start )) s"
else
  echo "gpu_check: ${problems} problem(s) above, in $(( $(date +%s) - start )) s"
  exit 1
fi
