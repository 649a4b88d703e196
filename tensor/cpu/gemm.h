// The one CPU GEMM entry point of Loom: every f32 matrix product of the tensor layer on CPU goes
// through sgemm / sgemm_batched, so the backend library is a single choice made here.
//
// Backend: oneDNN's dnnl_sgemm (row-major, 64-bit dims). Chosen by measurement with
// //tools/bench:gemm_bench on GPT-2's matmul shapes, one thread: oneDNN 2.6 ran fastest on every
// shape set, ahead of OpenBLAS 0.3.21 and BLIS 0.9.0 (table and reasoning in docs/cpu_gemm.md).
//
// Conventions (BLAS semantics, row-major):
//   C = alpha * op(A) @ op(B) + beta * C, op(X) = X or X^T per flag.
//   op(A) is (M, K), op(B) is (K, N), C is (M, N). Leading dims are row strides in elements: the
//   stored A is (M, K) [or (K, M) when transpose_a], so lda >= max(1, its column count); same
//   for B and ldb; ldc >= max(1, N).
//   M, N or K == 0 is allowed. K == 0 (or alpha == 0) gives C = beta * C; beta == 0 overwrites C
//   without reading it (NaN/Inf already in C do not propagate).
//   Bad arguments (negative sizes, too-small leading dims, overlapping batched outputs) throw
//   loom::Error naming the argument, its value and what was expected.
//
// Threads: the backend's default (oneDNN here runs OpenMP: OMP_NUM_THREADS, else one thread per
// core) unless set_gemm_threads() was called.
#pragma once

#include <cstdint>
#include <span>

namespace loom::cpu {

// C = alpha * op(A) @ op(B) + beta * C, row-major, f32. op(X) = X or X^T per flag; leading dims
// are row strides. A is (M,K) after op, B is (K,N) after op, C is (M,N).
void sgemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc);

// Batched: `batch` independent GEMMs with element strides between consecutive A, B, C matrices
// (stride 0 means the same matrix for every batch entry, i.e. broadcasting). Strides must be
// >= 0, and when batch > 1 the C matrices must not overlap (stride_c >= (M-1)*ldc + N), since
// the entries may run in any order.
void sgemm_batched(int64_t batch, bool transpose_a, bool transpose_b, int64_t m, int64_t n,
                   int64_t k, float alpha, const float* a, int64_t lda, int64_t stride_a,
                   const float* b, int64_t ldb, int64_t stride_b, float beta, float* c, int64_t ldc,
                   int64_t stride_c);

// Batched over matrices at any offsets (in elements from a, b and c): entry i multiplies
// a + a_offsets[i] by b + b_offsets[i] into c + c_offsets[i]. This takes the heads of a
// (B, T, H, D) activation viewed as (B, H, T, D) as they lie, with no copy. The three spans have
// `batch` entries, each >= 0; the C matrices must not overlap (not checked here: matmul's
// outputs are fresh). The entries run one after another, each on every thread.
void sgemm_batched_at(int64_t batch, bool transpose_a, bool transpose_b, int64_t m, int64_t n,
                      int64_t k, float alpha, const float* a, int64_t lda,
                      std::span<const int64_t> a_offsets, const float* b, int64_t ldb,
                      std::span<const int64_t> b_offsets, float beta, float* c, int64_t ldc,
                      std::span<const int64_t> c_offsets);

// The backend, with its version, e.g. "oneDNN 2.6.3 (dnnl_sgemm)".
const char* gemm_library_name();

// Threads each later GEMM may use, process-wide (any calling thread); n >= 1. Without a call,
// the backend's default applies.
void set_gemm_threads(int n);
// The thread count the GEMM uses on this thread (set_gemm_threads' setting, applied here, or
// OpenMP's default): the element-wise kernels split over as many (vector_math.h).
int kernel_threads();

}  // namespace loom::cpu
