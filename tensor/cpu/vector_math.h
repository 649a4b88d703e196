// Vectorized, threaded CPU kernels for the element-wise work around the GEMMs (docs/
// cpu_performance.md): contiguous f32 in, contiguous f32 out. Each loop is written once in plain
// C++ that the compiler vectorizes, and built twice (target_clones): for AVX-512 and for the
// x86-64-v3 baseline (AVX2 + FMA); the loader picks the clone the CPU runs (an ifunc), so one
// binary runs everywhere and uses 16 lanes where they exist. Large arrays split over the OpenMP
// threads the GEMM uses (set_gemm_threads), in contiguous chunks aligned to 64 elements: each
// element's value is computed by the same vector instructions whatever the thread count, so
// results are bit-identical across thread counts and layouts (on one machine: the AVX-512 and
// AVX2 clones may differ in the last bit).
//
// exp is a polynomial (Cephes' expf: range reduction by ln 2 in two parts, degree-5 minimax),
// within 2 ulp of libm over the range used; GELU is the tanh approximation written as
// x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3), which is tanh's identity and avoids the
// cancellation of 1 + tanh(u) for negative u.
#pragma once

#include <cstdint>

namespace loom::cpu {

// y = gelu_tanh(x)
void gelu_f32(const float* x, float* y, int64_t n);
// out = grad * gelu_tanh'(x)
void gelu_backward_f32(const float* grad, const float* x, float* out, int64_t n);

// out = a (op) b element by element, and out = a (op) s with a scalar (kRsub: s - a). IEEE's
// operations, so the values are exactly the scalar loop's.
enum class Arith { kAdd, kSub, kMul, kDiv, kRsub };
void arith_f32(Arith op, const float* a, const float* b, float* out, int64_t n);
void arith_scalar_f32(Arith op, const float* a, float s, float* out, int64_t n);
// arith_f32 on a (rows, cols) block of row-major matrices with leading dims lda, ldb, ldo, on the
// calling thread (a tile of a larger, already split operation).
void arith_f32_block(Arith op, const float* a, int64_t lda, const float* b, int64_t ldb, float* out,
                     int64_t ldo, int64_t rows, int64_t cols);

// out[i] = value (zeroing gradients and fresh buffers).
void fill_f32(float* out, float value, int64_t n);

// One AdamW update of n elements, in place (torch.optim.AdamW's order of operations, in f32):
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   p = p (1 - lr wd) - lr * (m / bias1) / (sqrt(v / bias2) + eps)
struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay, bias1, bias2;
};
void adamw_f32(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
               const AdamWStep& step);

}  // namespace loom::cpu
