// gemm() on the emulated CUDA device (--config=cuda_emulated, tools/cuda_emulator/device): the
// contract of gemm_cublaslt.h computed by a plain loop on host memory (products added in double,
// one rounding to the problem's dtype, the bias added before it), so the ops above run their CUDA
// paths on a CPU. Not for speed: for checking those paths between GPU checks.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>

#include "base/error.h"
#include "tensor/cuda/gemm_cublaslt.h"
#include "tools/cuda_emulator/device/emulated_counts.h"

namespace loom::cuda {
namespace {

template <typename T>
float load(const void* base, int64_t index) {
  if constexpr (std::is_same_v<T, float>) {
    return static_cast<const float*>(base)[index];
  } else {
    return static_cast<float>(static_cast<const T*>(base)[index]);
  }
}

template <typename T>
void store(void* base, int64_t index, double value) {
  if constexpr (std::is_same_v<T, float>) {
    static_cast<float*>(base)[index] = static_cast<float>(value);
  } else {
    static_cast<T*>(base)[index] = T(static_cast<float>(value));
  }
}

template <typename T>
void gemm_typed(const GemmProblem& p, const void* a, const void* b, void* c, const void* bias) {
  for (int64_t batch = 0; batch < p.batch; ++batch) {
    const int64_t oa = batch * p.stride_a, ob = batch * p.stride_b, oc = batch * p.stride_c;
    for (int64_t i = 0; i < p.m; ++i) {
      for (int64_t j = 0; j < p.n; ++j) {
        double acc = 0.0;
        for (int64_t k = 0; k < p.k; ++k) {
          const float x = load<T>(a, oa + (p.transpose_a ? k * p.lda + i : i * p.lda + k));
          const float y = load<T>(b, ob + (p.transpose_b ? j * p.ldb + k : k * p.ldb + j));
          acc += static_cast<double>(x) * y;
        }
        if (bias != nullptr && p.k > 0) acc = static_cast<float>(acc) + load<T>(bias, j);
        store<T>(c, oc + i * p.ldc + j, acc);
      }
    }
  }
}

}  // namespace

void gemm(const GemmProblem& p, const void* a, const void* b, void* c, int device,
          const void* bias) {
  LOOM_CHECK(p.m >= 0 && p.n >= 0 && p.k >= 0 && p.batch >= 1,
             "gemm: sizes must be non-negative and batch >= 1, got m {} n {} k {} batch {}", p.m,
             p.n, p.k, p.batch);
  loom_emu::count(bias == nullptr ? "gemm cublasLtMatmul" : "gemm cublasLtMatmul (bias epilogue)");
  switch (p.dtype) {
    case DType::kFloat32:
      gemm_typed<float>(p, a, b, c, bias);
      return;
    case DType::kBFloat16:
      gemm_typed<__nv_bfloat16>(p, a, b, c, bias);
      return;
    case DType::kFloat16:
      gemm_typed<__half>(p, a, b, c, bias);
      return;
    default:
      LOOM_FAIL("gemm: dtype {} is not f32, bf16 or f16", dtype_name(p.dtype));
  }
}

std::size_t gemm_plan_cache_size(int) { return 0; }

}  // namespace loom::cuda
