// bf16 GEMMs on CPU (mixed precision): bf16 operands, f32 accumulation, one rounding of the
// result. oneDNN's matmul primitive runs them with AVX512_BF16 (or AMX) dot products, ~2x the
// f32 GEMM's rate on such CPUs (docs/cpu_performance.md). Where the CPU lacks them,
// bf16_gemm_native() is false and callers convert to f32 and use sgemm (gemm.h) instead, as
// they did before: oneDNN's emulated bf16 is slower than that.
//
// Conventions as sgemm's (row-major, op(X) per flag, leading dims are row strides), with
// beta = 0 (C is overwritten) and alpha = 1. Primitives are built once per problem shape and
// kept (building one costs ~1 ms; GPT-2 has a few dozen shapes).
#pragma once

#include <cstdint>
#include <span>

namespace loom::cpu {

// Whether gemm_bf16 runs on native bf16 instructions here (and LOOM_BF16_GEMM is not "0").
bool bf16_gemm_native();

// C = op(A) @ op(B) (+ bias broadcast over rows when `bias` is not null). A, B and bias are bf16
// (raw uint16 bits); C is bf16 when c_bf16, else f32. Throws loom::Error on bad arguments or
// when oneDNN refuses the problem.
void gemm_bf16(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k,
               const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, void* c, bool c_bf16,
               int64_t ldc, const uint16_t* bias = nullptr);

// `batch` products at element offsets (as sgemm_batched_at), each with gemm_bf16's contract.
void gemm_bf16_batched_at(int64_t batch, bool transpose_a, bool transpose_b, int64_t m, int64_t n,
                          int64_t k, const uint16_t* a, int64_t lda,
                          std::span<const int64_t> a_offsets, const uint16_t* b, int64_t ldb,
                          std::span<const int64_t> b_offsets, void* c, bool c_bf16, int64_t ldc,
                          std::span<const int64_t> c_offsets);

}  // namespace loom::cpu
