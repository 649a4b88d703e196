// Neural-network ops (loom::ops): softmax, layer norm, embedding, cross entropy, attention,
// dropout. Each forward records autograd (tensor/dispatch.h) and has an explicit backward kernel
// that its formula (autograd/formulas_nn.cc) calls; forwards return what their backward needs
// (mean/rstd, logsumexp, masks). autograd/functions_nn.h spells them as torch.nn.functional does.
//
// Common rules:
//   - CPU and CUDA (operands on one device, tensor/op_device.h; CUDA kernels in
//     tensor/cuda/kernels/nn.h); floating dtypes f32/bf16/f16. bf16/f16 are loaded into f32,
//     computed in f32 (CPU sums accumulate in f64, CUDA ones in f32) and rounded once on store.
//     Statistics a backward needs (layer norm mean/rstd, logsumexp) are always f32, whatever the
//     input dtype.
//   - Inputs may have any strides (transposed or sliced views); outputs are contiguous.
//   - Every op first calls dispatch_op() with its OpId (tensor/op_list.h), tensors and
//     attributes in declaration order (undefined optional tensors are passed as undefined).
//     Multi-output ops return the handler's outputs in the order of the result struct's fields.
//   - Wrong rank, shape, dtype or device throws loom::Error naming the op and the shapes.
#pragma once

#include <cstdint>

#include "tensor/rng.h"
#include "tensor/tensor.h"

namespace loom::ops {

// ---- softmax ----------------------------------------------------------------------------------

// exp(x - max) / sum(exp(x - max)) along `dim` (negative dims count from the end).
Tensor softmax(const Tensor& x, int64_t dim);
// x - max - log(sum(exp(x - max))) along `dim`.
Tensor log_softmax(const Tensor& x, int64_t dim);
// Given out = softmax(x, dim): grad_x = out * (grad_out - sum(grad_out * out, dim)).
// grad_out is converted to out's dtype; the result has out's dtype.
Tensor softmax_backward(const Tensor& grad_out, const Tensor& out, int64_t dim);
// Given out = log_softmax(x, dim): grad_x = grad_out - exp(out) * sum(grad_out, dim).
Tensor log_softmax_backward(const Tensor& grad_out, const Tensor& out, int64_t dim);

// ---- layer norm -------------------------------------------------------------------------------

struct LayerNormResult {
  Tensor out;   // x.shape, x.dtype
  Tensor mean;  // x.shape[:-len(normalized_shape)], f32
  Tensor rstd;  // same shape, f32: 1 / sqrt(biased variance + eps)
};
// Normalizes over the trailing dims `normalized_shape` (which must equal x's last dims):
// out = (x - mean) * rstd * weight + bias. `weight` and `bias` have shape normalized_shape
// (and x's dtype or f32) or are undefined (no scale / no shift).
LayerNormResult layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                           const Tensor& bias, double eps = 1e-5);

struct LayerNormGrads {
  Tensor grad_x;       // x.shape, x.dtype
  Tensor grad_weight;  // normalized_shape, weight.dtype; undefined when weight is undefined
  Tensor grad_bias;    // normalized_shape, weight.dtype; undefined when weight is undefined
};
// Backward of layer_norm from its saved mean/rstd. grad_bias (= sum of grad_out over rows) is
// produced whenever weight is defined; a caller with a bias but no weight sums grad_out itself.
LayerNormGrads layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& mean,
                                   const Tensor& rstd, const Tensor& weight,
                                   const Shape& normalized_shape);

// RMSNorm over the last dim (Llama's): out = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps)
// per row, in f32. `weight` has shape (x.size(-1)) (x's dtype or f32) or is undefined.
struct RMSNormResult {
  Tensor out;   // x.shape, x.dtype
  Tensor rstd;  // x.shape[:-1], f32
};
RMSNormResult rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-5);

struct RMSNormGrads {
  Tensor grad_x;       // x.shape, x.dtype
  Tensor grad_weight;  // (n), weight.dtype; undefined when weight is undefined
};
// Backward of rms_norm from its saved rstd: with xhat = x * rstd and g' = g * weight,
// dx = rstd * (g' - xhat * mean(g' * xhat)), dweight = sum over rows of g * xhat.
RMSNormGrads rms_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& rstd,
                               const Tensor& weight);

// ---- rotary position embeddings ---------------------------------------------------------------

// Rotary embedding (Meta's Llama convention): x is (..., T, heads, head_dim); dims (2i, 2i+1) of
// every head at position t rotate together by the angle whose cosine and sine are cos[t, i] and
// sin[t, i] (tables (T, head_dim / 2)). `inverse` rotates by minus the angle: the backward, since a
// rotation's transpose is its inverse. In f32 (x's dtype out); cos and sin get no gradient.
Tensor rope(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse = false);

// ---- embedding --------------------------------------------------------------------------------

// Rows of `weight` (V, C) picked by `indices` (any shape, i64 or i32): shape (*indices.shape, C),
// weight's dtype. An index outside [0, V) throws naming the index, its position and V.
Tensor embedding(const Tensor& weight, const Tensor& indices);
// Scatter-add of grad_out (*indices.shape, C) into a (V, C) gradient (grad_out's dtype;
// bf16/f16 accumulate in f32). Repeated indices add up. `weight`, when given, is the table the
// gradient is for, read only for its layout: a vocabulary-sharded DTensor weight gets the rows
// of its own shard, not every rank the whole (V, C) gradient (its values are never read).
Tensor embedding_backward(const Tensor& grad_out, const Tensor& indices, int64_t num_embeddings,
                          const Tensor& weight = Tensor());

// ---- cross entropy ----------------------------------------------------------------------------

// How per-row losses combine. Stored as an int64 attribute in OpCall (the enum's value).
}  // namespace loom::ops

namespace loom {
// Declared in loom:: rather than loom::ops:: so that an unqualified call such as
// cross_entropy(logits, targets, -100, Reduction::kSum) does not also find ops::cross_entropy
// by argument-dependent lookup (which would make it ambiguous with loom::cross_entropy).
enum class Reduction : int64_t { kNone = 0, kMean = 1, kSum = 2 };
}  // namespace loom

namespace loom::ops {
using loom::Reduction;

// Logits that hold a slice of the classes (loss parallel, dtensor/sharding/nn.cc, Megatron's
// vocab-parallel cross entropy): columns [offset, offset + V) of `classes`. Targets are checked
// against `classes` (on the device on a GPU), so a bad one is named whichever shard it falls on.
struct ClassShard {
  int64_t offset = 0;
  int64_t classes = 0;  // 0: not sharded (the logits hold every class)
};

struct CrossEntropyResult {
  Tensor loss;       // () for kMean/kSum, (N,) for kNone (0 at ignored rows); f32
  Tensor logsumexp;  // (N,) f32: log(sum(exp(logits[n, :]))), saved for the backward
};
// Softmax cross entropy of logits (N, V) against class indices targets (N,) (i64 or i32), as
// torch.nn.functional.cross_entropy: loss_n = logsumexp(logits[n]) - logits[n, targets[n]].
// Rows whose target equals ignore_index contribute nothing; kMean divides by the number of
// rows not ignored, so when every row is ignored the mean is 0/0 = NaN (PyTorch's result too;
// kSum gives 0). A target outside [0, V) that is not ignore_index throws naming the target,
// its position and V. Computed in f32 whatever the logits' dtype, and the loss stays f32 (torch
// rounds it to the logits' dtype): bf16 logits go in as they are, with no f32 copy on a GPU, and
// their gradient (cross_entropy_backward) comes back in bf16, rounded once. So a mixed-precision
// model's loss needs no f32 logits (MixedPrecisionPolicy::output_dtype = param_dtype).
//
// With `shard` (reduction none only): logsumexp is the shard's own rows', and loss_n is this
// shard's part of the target term, -logits[n, targets[n] - offset] where it holds the target's
// class, else 0 (and 0 on ignored rows): loss parallel adds the parts of every shard to the
// rows' logsumexp combined from the shards'. One pass over the shard. It records no gradient
// (autograd refuses it: the loss parallel strategy runs it below autograd).
CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& targets,
                                 int64_t ignore_index = -100,
                                 Reduction reduction = Reduction::kMean,
                                 const ClassShard& shard = {});
// grad_logits = (softmax(logits) - onehot(targets)) * scale_n, with scale_n = grad_loss (kSum),
// grad_loss / count (kMean), grad_loss[n] (kNone), and 0 on ignored rows (so an all-ignored
// batch gets zeros, as in PyTorch). grad_loss is () (any one-element tensor) for kMean/kSum and
// (N,) for kNone. `logsumexp` is the forward's saved one; when undefined it is recomputed.
// Result: logits' shape and dtype.
//
// With `shard` (loss parallel): `logsumexp` is the whole rows', and a target outside this slice
// of the classes is a class another shard holds: its row gets the softmax part here and no
// one-hot. One pass over the shard, as unsharded.
//
// over_logits: the caller will not read `logits` again, so the gradient may be written over
// them (llm.c's classifier: no second logits-sized buffer at the backward's peak, 1.65 GB for
// GPT-2 small's bf16 16 x 1024 x 50257). Contiguous logits are then returned, holding the
// gradient; otherwise a new tensor, as without it.
Tensor cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& targets,
                              int64_t ignore_index = -100, Reduction reduction = Reduction::kMean,
                              const Tensor& logsumexp = {}, const ClassShard& shard = {},
                              bool over_logits = false);

// ---- attention --------------------------------------------------------------------------------

struct AttentionResult {
  Tensor out;        // (..., Tq, Dv), q's dtype
  Tensor logsumexp;  // (..., Tq) f32: per-query log(sum_j exp(scale * q.k_j)) over visible keys
};
// softmax(scale * q @ k^T + mask) @ v for q (..., Tq, D), k (..., Tk, D), v (..., Tk, Dv); the
// leading (batch, head) dims of the three must be equal. One dtype for q, k, v; products run
// through ops::matmul in f32. scale <= 0 means 1/sqrt(D). is_causal with causal_offset o masks
// key j for query i when j > i + o (o = 0: PyTorch's top-left alignment, also when Tq != Tk;
// o = Tk - Tq: bottom-right, a chunk of queries at the end of the keys, as context parallelism's
// chunk of queries at global positions s.. against keys 0.. takes o = s). Negative offsets are
// allowed; a non-zero causal_offset without is_causal throws (it would do nothing). The saved
// logsumexp (not the probabilities) keeps the backward's memory at O(Tq) per row. A query row
// that sees no key (Tk == 0, or i + o < 0) gives zeros and -inf logsumexp, and no gradient.
// FLOPs are counted over the whole (Tq, Tk) square, causal or not (tensor/flop_counter.h).
//
// Dropout on the probabilities (torch's dropout_p), when `dropout.p` > 0: out = (P * keep /
// (1 - p)) v, with the keep-mask bernoulli_keep_mask(Shape{batch..., Tq, Tk}, seed, p, region)
// (tensor/rng.h) drawn inside the kernels, bit for bit that mask on every device, and never
// stored: the backward draws it again from the same seed. So the call equals
// dropout(softmax(scale * q k^T + mask), p, seed, region) @ v, and logsumexp is the undropped
// softmax's. `region` places this call's (batch..., Tq, Tk) probabilities in a larger attention's
// (its batch and head offsets, and the positions of its queries and keys), so that a piece of
// the attention (a tensor-parallel rank's heads, a context-parallel block) drops what one rank
// computing the whole drops; empty: the call is the whole. A region takes at most two batch dims.
//
// Grouped-query attention (torch's enable_gqa): k and v may have fewer heads (dim -3) than q, a
// divisor of q's; query head h then attends with key/value head h / (Hq / Hkv), read in place
// (no copy of k and v per query head), and the backward's dk and dv (k's and v's shapes) sum
// their group's query heads in the kernel. Without enable_gqa the heads must be equal.
// (AttentionDropout is declared in namespace loom, beside RngRegion, so that a call passing one
// finds loom::scaled_dot_product_attention and ops::'s without lookup making them ambiguous.)
}  // namespace loom::ops
namespace loom {
struct AttentionDropout {
  double p = 0.0;
  uint64_t seed = 0;
  RngRegion region;
};
}  // namespace loom
namespace loom::ops {
AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             bool is_causal = false, double scale = 0.0,
                                             int64_t causal_offset = 0,
                                             const AttentionDropout& dropout = {},
                                             bool enable_gqa = false);

struct AttentionGrads {
  Tensor dq;  // q.shape, q.dtype
  Tensor dk;  // k.shape
  Tensor dv;  // v.shape
};
// Backward from the forward's saved logsumexp: recomputes the probabilities P, then
// dv = P^T dO, dP = dO v^T, dS = P * (dP - rowsum(P * dP)), dq = scale dS k, dk = scale dS^T q.
// `out` is the forward's output. On the CPU the row sums use P * dP (exact in f32 even when out
// was rounded to bf16). The GPU's fused kernels take FlashAttention's form rowsum(dO * out), as
// torch's CUDA backends do: one pass over dO and out instead of a second pass of S and dP over
// every key tile; it differs from rowsum(P * dP) by out's rounding only (bf16 tolerances, as
// every bf16 GPU result). is_causal, scale, causal_offset, dropout and enable_gqa must be the
// forward's (under dropout dP is taken through the forward's mask and dv from the dropped P).
// delta_from_out: the row sums from grad_out · out, the whole row's when `out` and `logsumexp`
// are a larger attention's over more keys than k and v hold — ring attention's per-block
// backward. Then delta_i = sum_d grad_out[i,d] * out[i,d] in f32 (bf16 operands upcast) replaces
// rowsum(P * dP) over this call's keys, so the gradients of the key blocks' calls sum (dq) and
// concatenate (dk, dv) to the whole attention's; a row that sees none of k's keys still gets no
// gradient. With out and logsumexp of this call's own forward it matches the default up to
// rounding (exactly when out was not rounded below f32).
AttentionGrads scaled_dot_product_attention_backward(
    const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
    const Tensor& logsumexp, bool is_causal = false, double scale = 0.0, int64_t causal_offset = 0,
    bool delta_from_out = false, const AttentionDropout& dropout = {}, bool enable_gqa = false);

// ---- dropout ----------------------------------------------------------------------------------

struct DropoutResult {
  Tensor out;   // x.shape, x.dtype
  Tensor mask;  // x.shape, f32 keep-mask of 0/1; undefined when x was returned unchanged
};
// out = x * mask / (1 - p) with mask = bernoulli_keep_mask(x.shape, seed, p) (tensor/rng.h):
// deterministic in (seed, element index). p == 0 or !training returns x itself (no copy) and an
// undefined mask; p == 1 gives zeros. p must be in [0, 1]. `region` says which block of a larger
// logical tensor x is (tensor/rng.h): a shard then draws exactly its slice of the whole tensor's
// mask, which is how sequence-parallel dropout matches one rank.
DropoutResult dropout(const Tensor& x, double p, uint64_t seed, bool training = true,
                      const RngRegion& region = {});
// grad * mask / (1 - p) (zeros when p == 1); an undefined mask returns grad unchanged.
Tensor dropout_backward(const Tensor& grad, const Tensor& mask, double p);

}  // namespace loom::ops
