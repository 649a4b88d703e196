// CUDA kernels of the neural-network ops (tensor/ops_nn.h), on contiguous data. The norms take
// their tensors in their own dtype (f32, bf16, f16: a DType and void pointers; activations,
// weights and gradients of one dtype) and compute in f32, rounding each output once, so a bf16
// model never copies an activation to f32 and back around a norm; statistics (mean, rstd) and
// the weights' gradient sums are f32. Softmax, RoPE, embedding and cross entropy likewise
// (RoPE's tables, the losses and logsumexp f32). The attention's composed path (attention_probs,
// attention_grad_scores) takes f32 scores. All give the CPU kernels' numerical recipe (f32
// arithmetic, f32 accumulation; only the summation order differs).
#pragma once

#include <cstdint>

#include "tensor/attention_dropout_mask.h"
#include "tensor/cuda/kernels/kernel_args.h"

namespace loom::cuda::kernels {

// A contiguous tensor seen as (outer, n, inner) around a reduced dim (ops_nn_norm.cc's RowLayout).
struct RowShape {
  int64_t outer = 1;
  int64_t n = 1;
  int64_t inner = 1;
};

// softmax (log = false) or log_softmax (log = true) along the middle dim, x and out of `dtype`.
void softmax_forward(DType dtype, void* out, const void* x, RowShape shape, bool log, int device);
// grad_x from grad_out and the forward's output, all of `dtype` (see ops::softmax_backward /
// log_softmax_backward).
void softmax_backward(DType dtype, void* grad_x, const void* grad_out, const void* out,
                      RowShape shape, bool log, int device);

// Rows of n of `dtype`: out = (x - mean) * rstd * w + b (w, b may be null); mean and rstd (f32)
// per row.
void layer_norm_forward(DType dtype, void* out, float* mean, float* rstd, const void* x,
                        const void* w, const void* b, int64_t rows, int64_t n, float eps,
                        int device);
// grad_x per row (`dtype`); grad_w and grad_b (f32 sums over rows) when w is not null.
void layer_norm_backward(DType dtype, void* grad_x, float* grad_w, float* grad_b,
                         const void* grad_out, const void* x, const float* mean, const float* rstd,
                         const void* w, int64_t rows, int64_t n, int device);

// Rows of n of `dtype`: out = x * rstd * w (w may be null), rstd = 1 / sqrt(mean(x^2) + eps)
// (f32) per row.
void rms_norm_forward(DType dtype, void* out, float* rstd, const void* x, const void* w,
                      int64_t rows, int64_t n, float eps, int device);
// grad_x per row (`dtype`); grad_w (an f32 sum over rows) when w is not null.
void rms_norm_backward(DType dtype, void* grad_x, float* grad_w, const void* grad_out,
                       const void* x, const float* rstd, const void* w, int64_t rows, int64_t n,
                       int device);

// Rotary embedding of x (outer, time, heads, 2 * half) contiguous, in its own `dtype`: pair
// (2i, 2i+1) at position t rotates by the angle whose cos and sin are cos[t, i], sin[t, i] (f32
// tables (time, half)); inverse rotates by minus the angle (the backward).
void rope_forward(DType dtype, void* out, const void* x, const float* cos, const float* sin,
                  int64_t outer, int64_t time, int64_t heads, int64_t half, bool inverse,
                  int device);

// Kernels that read indices check them on the device (tensor/cuda/device_checks.h): a failing
// position lowers *first_bad (atomicMin), which the host reads at its next synchronization.

// out[i, :] = weight[idx[i], :] for i < count (weight strided, any floating dtype, out
// contiguous). An index outside 0..v-1 is recorded in first_bad and its row written as zeros.
void embedding_forward(DType dtype, void* out, const void* weight, int64_t row_stride,
                       int64_t col_stride, const int64_t* idx, int64_t count, int64_t c, int64_t v,
                       int64_t* first_bad, int device);
// grad_w[r, :] = the sum of grad_out[i, :] over the i with idx[i] == r, in increasing i (as the
// CPU adds them), in f32, written once in `dtype` (grad_out contiguous (count, c), grad_w
// (v, c); every row written, zeros where no index names it). Deterministic, without atomics: the
// positions are sorted by (index, position) first (a bitonic sort of the power of two
// embedding_backward_keys(count) int64 keys, in `keys`, which the caller allocates), then each
// row sums its run of them. An index outside 0..v-1 is recorded and skipped. count < 2^32,
// v < 2^31.
inline int64_t embedding_backward_keys(int64_t count) {
  int64_t padded = 1;
  while (padded < count) padded <<= 1;
  return padded;
}
void embedding_backward(DType dtype, void* grad_w, const void* grad_out, const int64_t* idx,
                        int64_t count, int64_t c, int64_t v, int64_t* keys, int64_t* first_bad,
                        int device);

// Per row of logits (n, v) in `dtype`, read as f32: lse[r] = logsumexp, losses[r] = lse -
// logits[r, t] (0 if ignored), both f32. A target neither in 0..v-1 nor ignore_index is
// recorded in first_bad and its loss is NaN. With classes > 0 the logits hold classes
// [offset, offset + v) of `classes` (loss parallel): targets are checked against `classes`, and
// losses[r] is this shard's part, -logits[r, t - offset] where the target is here, else 0.
void cross_entropy_forward(DType dtype, float* lse, float* losses, const void* logits,
                           const int64_t* targets, int64_t n, int64_t v, int64_t offset,
                           int64_t classes, int64_t ignore_index, int64_t* first_bad, int device);
// *count = the number of targets[0..n) that are not ignore_index (the mean's divisor).
void count_targets(int64_t* count, const int64_t* targets, int64_t n, int64_t ignore_index,
                   int device);
// x[0] = x[0] / *count, divided in double (the mean of a sum of losses).
void divide_by_count(float* x, const int64_t* count, int device);
// grad[r, :] = (softmax - onehot) * scale_r in `dtype` (computed in f32, rounded once); reduction
// 0 none (grad_loss[r]), 1 mean (grad_loss[0] / *count, count on the device), 2 sum
// (grad_loss[0]); ignored rows are 0. A target out of range is recorded in first_bad and its row
// is NaN. With classes > 0 the logits hold classes [offset, offset + v) of `classes` (loss
// parallel): targets are checked against `classes`, and the one-hot is taken where it falls here.
void cross_entropy_backward(DType dtype, void* grad, const void* logits, const float* lse,
                            const int64_t* targets, const float* grad_loss, int64_t n, int64_t v,
                            int64_t offset, int64_t classes, int64_t ignore_index, int reduction,
                            const int64_t* count, int64_t* first_bad, int device);

// Counter-based random fills, bit-identical to tensor/rng.cc for bernoulli and uniform (normal
// goes through double log/cos, whose last bits may differ from the host's libm; the f32 results
// agree to an ulp). Element i of `out` (contiguous, numel elements) draws with global index
// base + sum_d coord_d(i) * global.strides[d], coords in `global.sizes` (the local shape).
enum class RandomKind : int { kNormal = 1, kUniform = 2, kBernoulliKeep = 3 };
void philox_fill(DType dtype, void* out, const StridedArg& global, int64_t base, uint64_t seed,
                 RandomKind kind, double a, double b, int device);

// Fused (FlashAttention-2 style) attention over contiguous q (rows, tq, d), k (rows, tk, d),
// v (rows, tk, dv) of one floating dtype, never materializing a (tq, tk) matrix in global memory:
// 64-row query and key tiles in shared memory (f32), online softmax with f32 running max and sum.
// Same semantics as ops::scaled_dot_product_attention: causal masks key j for query i when
// j > i + causal_offset (0: top-left aligned); a row that sees no key (tk == 0, or
// i + causal_offset < 0) gives zero outputs, -inf logsumexp and zero dq. Head dims d, dv up to
// kFlashMaxHeadDim (the launchers throw loom::Error naming the sizes beyond it; ops_nn_attention.cc
// falls back to the composed path there).
inline constexpr int64_t kFlashMaxHeadDim = 128;
struct FlashAttentionShape {
  int64_t rows = 1;  // batch * heads
  int64_t tq = 0, tk = 0, d = 0, dv = 0;
  float scale = 1.0f;
  bool causal = false;
  int64_t causal_offset = 0;  // causal: query i sees keys j <= i + causal_offset
  // Dropout on the probabilities, drawn in the kernels (inactive by default): P V takes
  // P * factor, and the backward dP * factor and (P * factor)^T dO.
  AttentionDropoutMask dropout;
  // Grouped-query attention: row bh's keys and values are k, v row bh / group (k, v, dk and dv
  // have rows / group rows; the backward sums each group's query rows into them).
  int64_t group = 1;
};
// out (rows, tq, dv) in `dtype`, lse (rows, tq) f32.
void flash_attention_forward(DType dtype, void* out, float* lse, const void* q, const void* k,
                             const void* v, const FlashAttentionShape& shape, int device);
// dq, dk, dv (q's, k's, v's shapes) in `dtype` from grad_out (rows, tq, dv) and the forward's lse.
// `delta` is scratch of rows * tq f32: delta_i = rowsum(P * dP)_i, computed tile-wise by the dq
// pass (one block per query tile) before the dk/dv pass (one block per key/value row and key
// tile, looping over that row's group of query rows) reads it.
// delta_given: `delta` already holds the row sums (ring attention's whole-row rowsum(dO * out));
// the dq pass reads them instead of summing P * dP over these keys, and leaves them unchanged.
void flash_attention_backward(DType dtype, void* dq, void* dk, void* dv, float* delta,
                              const void* grad_out, const void* q, const void* k, const void* v,
                              const float* lse, const FlashAttentionShape& shape, int device,
                              bool delta_given = false);

// Attention's row work on f32 scores (rows * tq rows of tk): probs in place, with lse per row.
// from_lse: recompute probs from a saved lse instead (the backward), -inf lse rows are all zero.
// causal: query i sees keys j <= i + causal_offset. The composed path's, used for head dims
// beyond kFlashMaxHeadDim.
void attention_probs(float* scores, float* lse, int64_t rows, int64_t tq, int64_t tk, float scale,
                     bool causal, int64_t causal_offset, bool from_lse, int device);
// Multiplies element (row r, query i, key j) of rows * tq rows of tk f32 values in place by
// mask.factor(r, i, j): dropout on the composed path's probabilities and their gradient.
void attention_dropout_scale(float* values, int64_t rows, int64_t tq, int64_t tk,
                             const AttentionDropoutMask& mask, int device);
// dS = P * (dP - rowsum(P * dP)) * scale, in place over dP; `delta` (rows f32), when not null,
// replaces rowsum(P * dP) (ring attention's whole-row rowsum(dO * out)).
void attention_grad_scores(float* dp, const float* probs, int64_t rows, int64_t tk, float scale,
                           int device, const float* delta = nullptr);

}  // namespace loom::cuda::kernels
