// Scaled dot-product attention and its backward (tensor/ops_nn.h). On CUDA, head dims up to
// cuda::kernels::kFlashMaxHeadDim run the fused FlashAttention-2 style kernels
// (kernels/flash_attention.cu: no (Tq, Tk) matrix in memory); bf16 and f16 at head dims 16, 32,
// 64 and 128 run them on tensor cores (kernels/flash_attention_mma.h), reading attention's usual
// strided views (heads transposed out of a fused QKV projection) without copies and writing the
// outputs in the inputs' memory order, so the caller's transposes back are views. On the CPU the
// fused kernels of tensor/cpu/attention_kernels.h do the same one query row at a time. CUDA with
// larger head dims runs the four products per direction through ops::matmul (transposes passed as
// flags) and attention.cu's row-wise softmax kernels.
#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <string_view>

#include "base/error.h"
#include "tensor/attention_attrs.h"
#include "tensor/attention_dropout_mask.h"
#include "tensor/cpu/attention_kernels.h"
#include "tensor/cpu/parallel.h"
#include "tensor/cuda/kernels/flash_attention_mma.h"
#include "tensor/cuda/kernels/nn.h"
#include "tensor/dispatch.h"
#include "tensor/flop_counter.h"
#include "tensor/op_device.h"
#include "tensor/ops_copy.h"
#include "tensor/ops_elementwise.h"
#include "tensor/ops_matmul.h"
#include "tensor/ops_nn.h"
#include "tensor/ops_nn_internal.h"
#include "tensor/ops_reduce.h"
#include "tensor/ops_views.h"

namespace loom::ops {

using nn_internal::check_floating;

namespace {

// Sizes of one attention call: q (batch..., tq, d), k (batch..., tk, d), v (batch..., tk, dv).
struct AttentionDims {
  Shape batch;
  int64_t rows = 1;  // product of the batch dims
  int64_t tq = 0, tk = 0, d = 0, dv = 0;
  float scale = 1.0f;
  bool causal = false;
  int64_t causal_offset = 0;     // query i sees key j <= i + causal_offset when causal
  AttentionDropoutMask dropout;  // inactive unless the call drops
  int64_t group = 1;             // query heads per key/value head (grouped-query attention)
};

// Where this call's (batch..., tq, tk) probabilities sit in the whole attention's mask
// (tensor/attention_dropout_mask.h), checked as rng.cc checks a region.
AttentionDropoutMask dropout_mask(const AttentionDims& dims, const AttentionDropout& dropout,
                                  std::string_view op) {
  LOOM_CHECK(dropout.p >= 0.0 && dropout.p <= 1.0,
             "{}: dropout probability must be in [0, 1], got {}", op, dropout.p);
  AttentionDropoutMask mask;
  if (dropout.p == 0.0) return mask;
  Shape local = dims.batch;
  local.insert(local.end(), {dims.tq, dims.tk});
  const RngRegion region = resolved_region(dropout.region, local);
  const Shape &global = region.global_shape, &offset = region.global_offset;
  LOOM_CHECK(global.size() == local.size() && offset.size() == local.size(),
             "{}: a dropout region of global shape {} and offset {} does not match this call's "
             "probabilities (batch..., Tq, Tk) = {}",
             op, shape_str(global), shape_str(offset), shape_str(local));
  for (size_t d = 0; d < local.size(); ++d) {
    LOOM_CHECK(offset[d] >= 0 && offset[d] + local[d] <= global[d],
               "{}: this call's probabilities {} at offset {} do not fit in the dropout region's "
               "global shape {}",
               op, shape_str(local), shape_str(offset), shape_str(global));
  }
  const size_t batch_dims = dims.batch.size();
  const bool whole = global == local;
  LOOM_CHECK(batch_dims <= 2 || whole,
             "{}: a dropout region takes at most two batch dims (batch, heads); got probabilities "
             "{} in {}",
             op, shape_str(local), shape_str(global));
  const Strides strides = contiguous_strides(global);
  for (size_t d = 0; d < local.size(); ++d) mask.base += offset[d] * strides[d];
  mask.row_stride = strides[batch_dims];
  if (batch_dims > 2) {  // the whole: entries follow one another
    mask.batch_stride = dims.tq * dims.tk;
  } else if (batch_dims >= 1) {
    mask.batch_stride = strides[0];
    if (batch_dims == 2) {
      mask.heads = dims.batch[1];
      mask.head_stride = strides[1];
    }
  }
  mask.seed = dropout.seed;
  mask.threshold = philox::keep_threshold(dropout.p);
  mask.rescale = dropout.p < 1.0 ? static_cast<float>(1.0 / (1.0 - dropout.p)) : 0.0f;
  return mask;
}

AttentionDims check_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal,
                              double scale, int64_t causal_offset, std::string_view op,
                              const AttentionDropout& dropout, bool enable_gqa) {
  LOOM_CHECK(is_causal || causal_offset == 0,
             "{}: causal_offset {} needs is_causal = true (is_causal = false sees every key, so "
             "the offset would do nothing)",
             op, causal_offset);
  check_floating(q, op, "q");
  check_floating(k, op, "k");
  check_floating(v, op, "v");
  LOOM_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(),
             "{}: q, k and v must have one dtype, got {}, {} and {}", op, dtype_name(q.dtype()),
             dtype_name(k.dtype()), dtype_name(v.dtype()));
  const auto shapes = [&] {
    return fmt::format("q {}, k {}, v {}", shape_str(q.shape()), shape_str(k.shape()),
                       shape_str(v.shape()));
  };
  LOOM_CHECK(q.dim() >= 2 && q.dim() == k.dim() && q.dim() == v.dim(),
             "{}: q, k and v must have one rank >= 2 (..., T, D), got shapes {}", op, shapes());
  AttentionDims dims;
  dims.batch.assign(q.shape().begin(), q.shape().end() - 2);
  // Grouped-query attention: k's and v's heads (dim -3) may be a divisor of q's; every other
  // batch dim must agree.
  const int64_t head_dim = q.dim() - 3;
  const bool grouped = enable_gqa && q.dim() >= 3 && k.size(head_dim) != q.size(head_dim);
  const auto same_batch_as_q = [&](const Tensor& t) {
    for (int64_t d = 0; d < q.dim() - 2; ++d) {
      if (t.size(d) != q.size(d) && !(grouped && d == head_dim)) return false;
    }
    return true;
  };
  LOOM_CHECK(same_batch_as_q(k) && same_batch_as_q(v),
             "{}: q, k and v must have the same leading (batch) dims{}, got shapes {}", op,
             enable_gqa ? " but for the heads (dim -3)"
                        : " (k and v with fewer heads: pass enable_gqa = true)",
             shapes());
  if (grouped) {
    const int64_t hq = q.size(head_dim), hkv = k.size(head_dim);
    LOOM_CHECK(v.size(head_dim) == hkv && hkv > 0 && hq >= hkv && hq % hkv == 0,
               "{}: grouped-query attention needs k and v with one head count dividing q's, got "
               "shapes {}",
               op, shapes());
    dims.group = hq / hkv;
  }
  dims.rows = shape_numel(dims.batch);
  dims.tq = q.size(-2);
  dims.tk = k.size(-2);
  dims.d = q.size(-1);
  dims.dv = v.size(-1);
  LOOM_CHECK(k.size(-1) == dims.d, "{}: q and k must have the same last dim (D), got shapes {}", op,
             shapes());
  LOOM_CHECK(v.size(-2) == dims.tk,
             "{}: k and v must have the same sequence length (dim -2), got shapes {}", op,
             shapes());
  const double s =
      scale > 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(dims.d, 1)));
  dims.scale = static_cast<float>(s);
  dims.causal = is_causal;
  // Offsets beyond [-tq, tk] mean the same as its ends (no query sees a key; every query sees
  // every key): clamped, the kernels' i + 1 + offset cannot overflow.
  dims.causal_offset = std::clamp(causal_offset, -dims.tq, dims.tk);
  dims.dropout = dropout_mask(dims, dropout, op);
  return dims;
}

// The fused CUDA kernels take these sizes (head dims up to kFlashMaxHeadDim).
bool use_flash(const AttentionDims& dims, const Device& device) {
  return device.is_cuda() && dims.d <= cuda::kernels::kFlashMaxHeadDim &&
         dims.dv <= cuda::kernels::kFlashMaxHeadDim;
}

cuda::kernels::FlashAttentionShape flash_shape(const AttentionDims& dims) {
  return {.rows = dims.rows,
          .tq = dims.tq,
          .tk = dims.tk,
          .d = dims.d,
          .dv = dims.dv,
          .scale = dims.scale,
          .causal = dims.causal,
          .causal_offset = dims.causal_offset,
          .dropout = dims.dropout,
          .group = dims.group};
}

// Where a (..., T, D) operand's rows lie for the tensor-core kernels, as it is: its last dim
// contiguous and at most two batch dims (walked as batch, heads; any strides), or contiguous.
// nullopt otherwise (the caller makes it contiguous).
std::optional<cuda::kernels::AttentionRows> strided_rows(const Tensor& t) {
  if (t.stride(-1) != 1 && t.size(-1) > 1) return std::nullopt;
  const int64_t batch_dims = t.dim() - 2;
  if (batch_dims > 2) {
    if (!t.is_contiguous()) return std::nullopt;
    return cuda::kernels::contiguous_rows(t.size(-2), t.size(-1));
  }
  cuda::kernels::AttentionRows r{.heads = 1, .row_stride = t.stride(-2)};
  if (batch_dims >= 1) r.batch_stride = t.stride(0);
  if (batch_dims == 2) {
    r.heads = t.size(1);
    r.head_stride = t.stride(1);
  }
  return r;
}

// Which of a GPU's attention kernels a call of these operands takes (for a meta trace of a GPU's
// step, which has no pointers: fresh tensors are aligned, and the kernels are taken as switched
// on): the tensor-core ones on the views as they are, the plain flash ones on contiguous copies,
// or the composed products beyond kFlashMaxHeadDim.
enum class GpuAttentionPath { kTensorCores, kPlainFlash, kComposed };
GpuAttentionPath gpu_attention_path(const AttentionDims& dims, DType dtype,
                                    std::initializer_list<Tensor> operands) {
  if (dims.d > cuda::kernels::kFlashMaxHeadDim || dims.dv > cuda::kernels::kFlashMaxHeadDim)
    return GpuAttentionPath::kComposed;
  const auto shape = flash_shape(dims);
  for (const Tensor& t : operands) {
    const auto r = strided_rows(t);
    if (!r || !cuda::kernels::tensor_core_attention_layout_fits(dtype, shape, {*r}))
      return GpuAttentionPath::kPlainFlash;
  }
  return GpuAttentionPath::kTensorCores;
}

// An output of `shape` (..., T, n) laid out in `like`'s memory order when `like` is rank 4 with
// its time dim outside its heads in memory ((B, T, H, D) seen as (B, H, T, D): attention's heads
// transposed out of a projection), so the caller's transpose back to (B, T, H, n) is a view;
// contiguous otherwise.
Tensor empty_in_order_of(const Tensor& like, const Shape& shape, Device device) {
  if (like.dim() == 4 && like.stride(2) > like.stride(1)) {
    return transpose(Tensor::empty({shape[0], shape[2], shape[1], shape[3]}, like.dtype(), device),
                     1, 2);
  }
  return Tensor::empty(shape, like.dtype(), device);
}

// dq, dk and dv laid out as q, k and v. When those are slices of one buffer that stack into a
// dense block (a fused QKV projection's: one storage, shape and strides, offsets one step
// apart), the gradients share one fresh buffer in the same arrangement, so the caller's stack of
// them (unbind's backward) is a view (ops::stacked_view) instead of a copy.
std::array<Tensor, 3> gradients_laid_out_like(const Tensor& q, const Tensor& k, const Tensor& v,
                                              Device device) {
  if (stacked_view(std::vector<Tensor>{q, k, v}, q.dim()).defined()) {
    const int64_t step = k.offset() - q.offset();
    const Tensor buffer = Tensor::empty({3 * q.numel()}, q.dtype(), device);
    std::array<Tensor, 3> grads;
    for (int64_t i = 0; i < 3; ++i) {
      grads[i] =
          Tensor::from_storage(buffer.storage(), q.shape(), q.strides(), i * step, q.dtype());
    }
    return grads;
  }
  return {empty_in_order_of(q, q.shape(), device), empty_in_order_of(k, k.shape(), device),
          empty_in_order_of(v, v.shape(), device)};
}

// An operand as the CPU kernels take it: f32 with a contiguous last dim (a copy otherwise),
// its matrices' offsets and row stride. `f32` keeps the tensor alive.
struct CpuOperand {
  Tensor f32;
  std::vector<int64_t> offsets;
  cpu::RowMatrices rows() const { return {f32.data<float>(), offsets, f32.stride(-2)}; }
};

CpuOperand cpu_operand(const Tensor& t, int64_t entries) {
  Tensor f = to(t, kFloat32);
  if (f.stride(-1) != 1 && f.size(-1) > 1) f = contiguous(f);
  std::vector<int64_t> offsets =
      f.dim() > 2 ? nn_internal::batch_offsets(f, entries) : std::vector<int64_t>{0};
  return {f, std::move(offsets)};
}

// delta_from_out's row sums on the CPU, delta_i = sum_d grad_out[i,d] * out[i,d], from the
// operands' f32 rows: no product tensor, and no second f32 copy of grad_out (as delta_from
// would make). (entries, tq) f32, allocated alike on the meta device, computed only on the CPU.
Tensor cpu_row_dots(const CpuOperand& grad_out, const CpuOperand& out, const AttentionDims& dims,
                    const Shape& lse_shape, Device device) {
  Tensor delta = Tensor::empty(lse_shape, kFloat32, device);
  if (device.is_meta()) return delta;
  const cpu::RowMatrices g = grad_out.rows(), o = out.rows();
  float* pd = delta.data<float>();
  // Each row's sum is the same whichever thread computes it: rows split over the threads.
  cpu::parallel_for(dims.rows * dims.tq, cpu::kParallelGrain / std::max<int64_t>(1, dims.dv),
                    /*align=*/1, [&](int64_t begin, int64_t end) {
                      for (int64_t row = begin; row < end; ++row) {
                        const int64_t e = row / dims.tq, i = row % dims.tq;
                        const float* gi = g.base + g.offsets[e] + i * g.row_stride;
                        const float* oi = o.base + o.offsets[e] + i * o.row_stride;
                        double sum = 0.0;  // as Loom's f32 sums accumulate
                        for (int64_t d = 0; d < dims.dv; ++d) {
                          sum += static_cast<double>(gi[d]) * oi[d];
                        }
                        pd[row] = static_cast<float>(sum);
                      }
                    });
  return delta;
}

cpu::AttentionShape cpu_shape(const AttentionDims& dims) {
  return {.entries = dims.rows,
          .tq = dims.tq,
          .tk = dims.tk,
          .d = dims.d,
          .dv = dims.dv,
          .scale = dims.scale,
          .causal = dims.causal,
          .causal_offset = dims.causal_offset,
          .dropout = dims.dropout,
          .group = dims.group};
}

// FLOPs of attention's two products, QK^T and PV, over the whole (tq, tk) square (causal too, as
// torch's FlopCounterMode counts); a backward is counted as two forwards (tensor/flop_counter.h).
int64_t attention_flops(const AttentionDims& dims) {
  return 2 * dims.rows * dims.tq * dims.tk * (dims.d + dims.dv);
}

// Batched f32 product a @ b^T (or a^T @ b): views, so matmul passes the transposes as flags.
Tensor mm_nt(const Tensor& a, const Tensor& b) { return matmul(a, transpose(b, -1, -2)); }
Tensor mm_tn(const Tensor& a, const Tensor& b) { return matmul(transpose(a, -1, -2), b); }

// Grouped-query attention on the composed path: k and v repeated to every query head of their
// group (repeat_interleave over the heads, dim -3), and a gradient of that summed back over each
// group.
Tensor repeat_heads(const Tensor& t, int64_t group) { return repeat_interleave(t, group, -3); }
Tensor sum_groups(const Tensor& t, int64_t group) {
  if (group == 1) return t;
  Shape split = t.shape();
  split[split.size() - 3] /= group;
  split.insert(split.end() - 2, group);
  return sum(reshape(t, split), {-3});
}

// delta_from_out's row sums delta_i = sum_d grad_out[i,d] * out[i,d] in f32: (batch..., tq),
// contiguous (the kernels index it as (rows, tq)).
Tensor delta_from(const Tensor& grad_out, const Tensor& out) {
  return contiguous(sum(mul(to(grad_out, kFloat32), to(out, kFloat32)), {-1}));
}

}  // namespace

void append_attention_dropout(std::vector<OpAttr>& attrs, const AttentionDropout& dropout) {
  if (dropout.p == 0.0) return;
  attrs.insert(attrs.end(), {dropout.p, static_cast<int64_t>(dropout.seed),
                             dropout.region.global_shape, dropout.region.global_offset});
}

AttentionDropout attention_dropout_of(const OpCall& call, size_t own) {
  if (call.attrs.size() <= own) return {};
  return {.p = call.double_attr(own),
          .seed = static_cast<uint64_t>(call.int_attr(own + 1)),
          .region = {call.ints_attr(own + 2), call.ints_attr(own + 3)}};
}

AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             bool is_causal, double scale, int64_t causal_offset,
                                             const AttentionDropout& dropout, bool enable_gqa) {
  std::vector<OpAttr> attrs{is_causal, scale, causal_offset, enable_gqa};
  append_attention_dropout(attrs, dropout);
  if (auto r = dispatch_op(OpId::scaled_dot_product_attention, {q, k, v}, std::move(attrs))) {
    return {(*r)[0], (*r)[1]};
  }
  constexpr std::string_view op = "scaled_dot_product_attention";
  const AttentionDims dims =
      check_attention(q, k, v, is_causal, scale, causal_offset, op, dropout, enable_gqa);
  const Device device = op_device(op, {q, k, v});
  Shape lse_shape = dims.batch;
  lse_shape.push_back(dims.tq);
  // As a GPU's kernels allocate; beyond the fused kernels' head dims, the composed products
  // below run on the meta device as they would on a GPU (their row kernels skipped), so a trace
  // holds their f32 copies and (Tq, Tk) scores.
  const bool gpu_meta = device.is_meta() && !allocates_like_cpu(device);
  const GpuAttentionPath path =
      gpu_meta ? gpu_attention_path(dims, q.dtype(), {q, k, v}) : GpuAttentionPath::kComposed;
  if (gpu_meta && path != GpuAttentionPath::kComposed) {
    FlopCounter::record(attention_flops(dims));
    Shape out_shape = dims.batch;
    out_shape.insert(out_shape.end(), {dims.tq, dims.dv});
    Tensor lse = Tensor::empty(lse_shape, kFloat32, device);
    if (path == GpuAttentionPath::kTensorCores)
      return {empty_in_order_of(q, out_shape, device), lse};  // on the views, in q's order
    const Tensor qc = contiguous(q), kc = contiguous(k), vc = contiguous(v);  // plain flash
    return {Tensor::empty(out_shape, q.dtype(), device), lse};
  }
  if (use_flash(dims, device)) {
    FlopCounter::record(attention_flops(dims));
    Shape out_shape = dims.batch;
    out_shape.insert(out_shape.end(), {dims.tq, dims.dv});
    Tensor lse = Tensor::empty(lse_shape, kFloat32, device);
    const auto shape = flash_shape(dims);
    const auto rq = strided_rows(q), rk = strided_rows(k), rv = strided_rows(v);
    // The tensor-core kernels, on the views as they are. Checked on the inputs before allocating
    // the output, which qualifies by construction (fresh, aligned, strides multiples of D).
    if (rq && rk && rv &&
        cuda::kernels::tensor_core_attention_takes(
            q.dtype(), shape, {q.raw_data(), k.raw_data(), v.raw_data()}, {*rq, *rk, *rv})) {
      Tensor out = empty_in_order_of(q, out_shape, device);
      const cuda::kernels::AttentionLayouts layouts{
          .q = *rq, .k = *rk, .v = *rv, .o = *strided_rows(out)};
      cuda::kernels::mma_attention_forward(q.dtype(), out.raw_data(), lse.data<float>(),
                                           q.raw_data(), k.raw_data(), v.raw_data(), shape, layouts,
                                           device.index);
      return {out, lse};
    }
    const Tensor qc = contiguous(q), kc = contiguous(k), vc = contiguous(v);
    Tensor out = Tensor::empty(out_shape, q.dtype(), device);
    cuda::kernels::flash_attention_forward(q.dtype(), out.raw_data(), lse.data<float>(),
                                           qc.raw_data(), kc.raw_data(), vc.raw_data(), shape,
                                           device.index);
    return {out, lse};
  }
  if (allocates_like_cpu(device)) {  // the CPU, or meta allocating as it does
    FlopCounter::record(attention_flops(dims));
    Shape out_shape = dims.batch;
    out_shape.insert(out_shape.end(), {dims.tq, dims.dv});
    const CpuOperand qo = cpu_operand(q, dims.rows), ko = cpu_operand(k, dims.rows / dims.group),
                     vo = cpu_operand(v, dims.rows / dims.group);
    Tensor out = Tensor::empty(out_shape, kFloat32, device);
    Tensor lse = Tensor::empty(lse_shape, kFloat32, device);
    if (device.is_meta()) return {to(out, q.dtype()), lse};
    cpu::attention_forward(cpu_shape(dims), qo.rows(), ko.rows(), vo.rows(), out.data<float>(),
                           lse.data<float>());
    return {to(out, q.dtype()), lse};
  }
  // CUDA with head dims above the fused kernels' limit: the composed products (k and v repeated
  // to every query head of their group).
  const Tensor qf = to(q, kFloat32), kf = repeat_heads(to(k, kFloat32), dims.group),
               vf = repeat_heads(to(v, kFloat32), dims.group);
  // scores (..., tq, tk), contiguous f32 fresh from the GEMM: overwritten in place by P.
  Tensor probs = mm_nt(qf, kf);
  Tensor lse = Tensor::empty(lse_shape, kFloat32, device);
  if (!device.is_meta()) {
    float* p = probs.data<float>();
    cuda::kernels::attention_probs(p, lse.data<float>(), dims.rows, dims.tq, dims.tk, dims.scale,
                                   dims.causal, dims.causal_offset, /*from_lse=*/false,
                                   device.index);
    cuda::kernels::attention_dropout_scale(p, dims.rows, dims.tq, dims.tk, dims.dropout,
                                           device.index);
  }
  Tensor out = matmul(probs, vf);
  return {to(out, q.dtype()), lse};
}

AttentionGrads scaled_dot_product_attention_backward(
    const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
    const Tensor& logsumexp, bool is_causal, double scale, int64_t causal_offset,
    bool delta_from_out, const AttentionDropout& dropout, bool enable_gqa) {
  std::vector<OpAttr> attrs{is_causal, scale, causal_offset, delta_from_out, enable_gqa};
  append_attention_dropout(attrs, dropout);
  if (auto r = dispatch_op(OpId::scaled_dot_product_attention_backward,
                           {grad_out, q, k, v, out, logsumexp}, std::move(attrs))) {
    return {(*r)[0], (*r)[1], (*r)[2]};
  }
  constexpr std::string_view op = "scaled_dot_product_attention_backward";
  const AttentionDims dims =
      check_attention(q, k, v, is_causal, scale, causal_offset, op, dropout, enable_gqa);
  check_floating(grad_out, op, "grad_out");
  check_floating(out, op, "out");
  check_floating(logsumexp, op, "logsumexp");
  Shape out_shape = dims.batch;
  out_shape.insert(out_shape.end(), {dims.tq, dims.dv});
  LOOM_CHECK(grad_out.shape() == out_shape && out.shape() == out_shape,
             "{}: grad_out shape {} and out shape {} must both be {} for q {} and v {}", op,
             shape_str(grad_out.shape()), shape_str(out.shape()), shape_str(out_shape),
             shape_str(q.shape()), shape_str(v.shape()));
  Shape lse_shape = dims.batch;
  lse_shape.push_back(dims.tq);
  LOOM_CHECK(logsumexp.shape() == lse_shape,
             "{}: logsumexp shape {} does not match {} for q shape {}", op,
             shape_str(logsumexp.shape()), shape_str(lse_shape), shape_str(q.shape()));
  const Device device = op_device(op, {grad_out, q, k, v, out, logsumexp});
  // As a GPU's kernels allocate; the composed products fall through to run on the meta device
  // as on a GPU (as in the forward).
  const bool gpu_meta = device.is_meta() && !allocates_like_cpu(device);
  const GpuAttentionPath path = gpu_meta && grad_out.dtype() == q.dtype()
                                    ? gpu_attention_path(dims, q.dtype(), {q, k, v, grad_out})
                                    : GpuAttentionPath::kComposed;
  if (gpu_meta && path != GpuAttentionPath::kComposed) {
    FlopCounter::record(2 * attention_flops(dims));
    const Tensor delta = Tensor::empty(lse_shape, kFloat32, device);  // the row sums' scratch
    if (path == GpuAttentionPath::kTensorCores) {
      // The gradients side by side when q, k and v are a fused projection's slices (so unbind's
      // backward stacks them as a view, not a copy).
      auto [dq, dk, dv] = gradients_laid_out_like(q, k, v, device);
      return {dq, dk, dv};
    }
    const Tensor qc = contiguous(q), kc = contiguous(k), vc = contiguous(v),
                 gc = contiguous(grad_out);
    return {Tensor::empty(q.shape(), q.dtype(), device),
            Tensor::empty(k.shape(), k.dtype(), device),
            Tensor::empty(v.shape(), v.dtype(), device)};
  }
  // The fused kernels read grad_out in q's dtype; another dtype (an f32 gradient of bf16
  // attention) takes the composed path, which uses it unrounded as the CPU does.
  if (use_flash(dims, device) && grad_out.dtype() == q.dtype()) {
    FlopCounter::record(2 * attention_flops(dims));
    const Tensor lse = nn_internal::as_f32(logsumexp);
    const auto shape = flash_shape(dims);
    // The row sums, from the output: rowsum(dO * out) in one pass over both (FlashAttention-2's
    // form, as torch's CUDA backends take them), where rowsum(P * dP) costs the dq kernel a
    // second pass of S and dP over every key tile (9 tile products a backward instead of 7). For
    // this call's own forward they differ only by out's rounding; delta_from_out needs them.
    // Without row-addressable operands of one dtype: the composed sums (delta_from_out) or
    // rowsum(P * dP), which the dq kernel writes into the scratch.
    const auto out_rows = strided_rows(out), grad_out_rows = strided_rows(grad_out);
    const bool row_dots = out_rows && grad_out_rows && out.dtype() == grad_out.dtype();
    const bool delta_given = row_dots || delta_from_out;
    Tensor delta = row_dots || !delta_from_out ? Tensor::empty(lse_shape, kFloat32, device)
                                               : delta_from(grad_out, out);
    if (row_dots) {
      cuda::kernels::attention_row_dots(grad_out.dtype(), delta.data<float>(), grad_out.raw_data(),
                                        out.raw_data(), *grad_out_rows, *out_rows, dims.rows,
                                        dims.tq, dims.dv, device.index);
    }
    const auto rq = strided_rows(q), rk = strided_rows(k), rv = strided_rows(v);
    const auto rg = strided_rows(grad_out);
    // The tensor-core kernels, on the views as they are; the gradients, allocated once the
    // inputs qualify, qualify by construction (fresh, aligned, strides and q/k/v offsets
    // multiples of 8 elements, as the aligned inputs' are).
    if (rq && rk && rv && rg &&
        cuda::kernels::tensor_core_attention_takes(
            q.dtype(), shape, {grad_out.raw_data(), q.raw_data(), k.raw_data(), v.raw_data()},
            {*rq, *rk, *rv, *rg})) {
      auto [dq, dk, dv] = gradients_laid_out_like(q, k, v, device);
      const cuda::kernels::AttentionLayouts layouts{.q = *rq,
                                                    .k = *rk,
                                                    .v = *rv,
                                                    .o = *rg,
                                                    .dq = *strided_rows(dq),
                                                    .dk = *strided_rows(dk),
                                                    .dv = *strided_rows(dv)};
      cuda::kernels::mma_attention_backward(q.dtype(), dq.raw_data(), dk.raw_data(), dv.raw_data(),
                                            delta.data<float>(), grad_out.raw_data(), q.raw_data(),
                                            k.raw_data(), v.raw_data(), lse.data<float>(), shape,
                                            layouts, device.index, delta_given);
      return {dq, dk, dv};
    }
    const Tensor qc = contiguous(q), kc = contiguous(k), vc = contiguous(v);
    const Tensor gc = contiguous(grad_out);
    Tensor dq = Tensor::empty(q.shape(), q.dtype(), device);
    Tensor dk = Tensor::empty(k.shape(), k.dtype(), device);
    Tensor dv = Tensor::empty(v.shape(), v.dtype(), device);
    cuda::kernels::flash_attention_backward(q.dtype(), dq.raw_data(), dk.raw_data(), dv.raw_data(),
                                            delta.data<float>(), gc.raw_data(), qc.raw_data(),
                                            kc.raw_data(), vc.raw_data(), lse.data<float>(), shape,
                                            device.index, delta_given);
    return {dq, dk, dv};
  }
  if (allocates_like_cpu(device)) {  // the CPU, or meta allocating as it does
    FlopCounter::record(2 * attention_flops(dims));
    const CpuOperand qo = cpu_operand(q, dims.rows), ko = cpu_operand(k, dims.rows / dims.group),
                     vo = cpu_operand(v, dims.rows / dims.group),
                     go = cpu_operand(grad_out, dims.rows);
    const Tensor lse = nn_internal::as_f32(logsumexp);
    Tensor dq = Tensor::empty(q.shape(), kFloat32, device),
           dk = Tensor::empty(k.shape(), kFloat32, device),
           dv = Tensor::empty(v.shape(), kFloat32, device);
    // Before the meta return: the trace allocates out's f32 rows and the sums as the CPU does.
    const Tensor delta =
        delta_from_out ? cpu_row_dots(go, cpu_operand(out, dims.rows), dims, lse_shape, device)
                       : Tensor();
    if (device.is_meta()) return {to(dq, q.dtype()), to(dk, k.dtype()), to(dv, v.dtype())};
    cpu::attention_backward(cpu_shape(dims), qo.rows(), ko.rows(), vo.rows(), go.rows(),
                            lse.data<float>(), dq.data<float>(), dk.data<float>(), dv.data<float>(),
                            delta_from_out ? delta.data<float>() : nullptr);
    return {to(dq, q.dtype()), to(dk, k.dtype()), to(dv, v.dtype())};
  }
  const Tensor qf = to(q, kFloat32), kf = repeat_heads(to(k, kFloat32), dims.group),
               vf = repeat_heads(to(v, kFloat32), dims.group);
  const Tensor gf = to(grad_out, kFloat32);
  const Tensor lse = nn_internal::as_f32(logsumexp);
  // P recomputed from the scores and the saved logsumexp; masked and empty rows are 0.
  // The row kernels run on a GPU only: on the meta device (a GPU's step traced) the products
  // allocate as they would, and nothing is computed.
  const bool gpu = !device.is_meta();
  Tensor probs = mm_nt(qf, kf);
  if (gpu) {
    cuda::kernels::attention_probs(probs.data<float>(), const_cast<float*>(lse.data<float>()),
                                   dims.rows, dims.tq, dims.tk, dims.scale, dims.causal,
                                   dims.causal_offset, /*from_lse=*/true, device.index);
  }
  // Under dropout, dv takes the dropped probabilities P V used, and dP passes through the mask.
  Tensor dropped = probs;
  if (dims.dropout.active()) {
    dropped = clone(probs);
    if (gpu) {
      cuda::kernels::attention_dropout_scale(dropped.data<float>(), dims.rows, dims.tq, dims.tk,
                                             dims.dropout, device.index);
    }
  }
  Tensor dv = mm_tn(dropped, gf);  // (..., tk, dv)
  Tensor dscores = mm_nt(gf, vf);  // dP (..., tq, tk), becomes dS in place
  const Tensor delta = delta_from_out ? delta_from(grad_out, out) : Tensor();
  if (gpu) {
    float* pd = dscores.data<float>();
    cuda::kernels::attention_dropout_scale(pd, dims.rows, dims.tq, dims.tk, dims.dropout,
                                           device.index);
    cuda::kernels::attention_grad_scores(pd, probs.data<float>(), dims.rows * dims.tq, dims.tk,
                                         dims.scale, device.index,
                                         delta_from_out ? delta.data<float>() : nullptr);
  }
  Tensor dq = matmul(dscores, kf);  // (..., tq, d)
  Tensor dk = mm_tn(dscores, qf);   // (..., tk, d)
  return {to(dq, q.dtype()), to(sum_groups(dk, dims.group), k.dtype()),
          to(sum_groups(dv, dims.group), v.dtype())};
}

}  // namespace loom::ops
