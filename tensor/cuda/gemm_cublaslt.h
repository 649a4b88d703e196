// The one CUDA GEMM entry point of Loom: every matrix product of the tensor layer on a GPU goes
// through gemm() here, on cuBLASLt (the GPU twin of tensor/cpu/gemm.h, with the same row-major
// conventions).
//
//   C = op(A) @ op(B) for `batch` matrices, op(X) = X or X^T per flag; op(A) is (M, K), op(B)
//   is (K, N), C is (M, N); leading dims are row strides in elements; batch strides in elements
//   (0 for A or B broadcasts one matrix over the batch). A, B and C share one dtype: f32, bf16
//   or f16; accumulation is always f32 (CUBLAS_COMPUTE_32F, no TF32, so f32 results match the
//   CPU's to ~1e-6 relative).
//
// Per device: one cuBLASLt handle and one workspace (kWorkspaceBytes), created on first use and
// reused by every call. Per problem (dtype, flags, sizes, leading dims, strides, pointer
// alignment, and the bias's alignment when there is one): the matmul descriptor, the three
// layouts and the heuristic's algorithm, cached, so a training step's repeated shapes pay for
// cublasLtMatmulAlgoGetHeuristic once.
// Runs on the device's compute stream (stream.h). Failures throw loom::Error naming the call,
// cuBLAS's status and the problem.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace loom::cuda {

inline constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

struct GemmProblem {
  DType dtype = DType::kFloat32;
  bool transpose_a = false;
  bool transpose_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  int64_t batch = 1;
};

// C = op(A) @ op(B) (alpha 1, beta 0: C is overwritten). K == 0 gives zeros.
// With `bias` (N elements of the problem's dtype, 16-byte aligned; batch 1 and K > 0 only),
// C = op(A) @ op(B) + bias broadcast over the rows, added by cuBLASLt's bias epilogue
// (CUBLASLT_EPILOGUE_BIAS) as each tile is written: no second pass over C (torch's addmm on CUDA
// does the same).
void gemm(const GemmProblem& problem, const void* a, const void* b, void* c, int device,
          const void* bias = nullptr);

// The alignment `bias` of gemm() must have.
inline constexpr std::size_t kBiasAlignment = 16;

// Number of distinct problems whose plan (descriptors + algorithm) is cached on `device`.
std::size_t gemm_plan_cache_size(int device);

}  // namespace loom::cuda
