// Embedding, cross entropy and dropout, with their backward kernels (tensor/ops_nn.h).
// Softmax and layer norm are in ops_nn_norm.cc, attention in ops_nn_attention.cc.
#include "tensor/ops_nn.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "tensor/attention_attrs.h"
#include "tensor/cpu/element_types.h"
#include "tensor/cuda/device_checks.h"
#include "tensor/cuda/kernels/nn.h"
#include "tensor/dispatch.h"
#include "tensor/op_device.h"
#include "tensor/ops_copy.h"
#include "tensor/ops_create.h"
#include "tensor/ops_cuda.h"
#include "tensor/ops_nn_internal.h"
#include "tensor/ops_views.h"
#include "tensor/rng.h"

namespace loom::ops {

using nn_internal::as_f32;
using nn_internal::check_floating;
using nn_internal::check_index;
using nn_internal::index_values;
using nn_internal::position_str;

namespace {

std::string embedding_index_message(int64_t index, int64_t flat, const Shape& indices_shape,
                                    int64_t num_embeddings, std::string_view op) {
  return fmt::format(
      "{}: index {} at position {} of indices shape {} is out of range for {} embeddings "
      "(expected 0..{})",
      op, index, position_str(flat, indices_shape), shape_str(indices_shape), num_embeddings,
      num_embeddings - 1);
}

// Throws unless `index` is a valid row of a (V, C) embedding table.
void check_embedding_index(int64_t index, int64_t flat, const Tensor& indices,
                           int64_t num_embeddings, std::string_view op) {
  LOOM_CHECK(index >= 0 && index < num_embeddings, "{}",
             embedding_index_message(index, flat, indices.shape(), num_embeddings, op));
}

// A device-side check of a GPU op's indices (tensor/cuda/device_checks.h): the kernel records
// the first failing position of `flat_indices` (int64, contiguous, on the GPU); only then is the
// failing value read back, to name it as the host check does.
int64_t* begin_index_check(const Tensor& flat_indices,
                           std::function<std::string(int64_t value, int64_t position)> message) {
  return cuda::begin_device_check(
      flat_indices.device().index, [flat_indices, message = std::move(message)](int64_t position) {
        return message(index_values(flat_indices).at(position), position);
      });
}

int64_t* begin_embedding_index_check(const Tensor& flat_indices, const Shape& shape,
                                     int64_t num_embeddings, std::string_view op) {
  return begin_index_check(flat_indices, [=](int64_t value, int64_t position) {
    return embedding_index_message(value, position, shape, num_embeddings, op);
  });
}

std::string target_message(int64_t target, int64_t row, int64_t v, const Shape& logits_shape,
                           int64_t ignore_index, std::string_view op) {
  return fmt::format(
      "{}: target {} at position {} is out of range for {} classes (logits shape {}); "
      "expected 0..{} or ignore_index {}",
      op, target, row, v, shape_str(logits_shape), v - 1, ignore_index);
}

// A class shard lies within its classes (none given: not sharded).
void check_class_shard(const Tensor& logits, const ClassShard& shard, std::string_view op) {
  if (shard.classes == 0 && shard.offset == 0) return;
  const int64_t width = logits.dim() == 2 ? logits.size(1) : -1;
  LOOM_CHECK(width >= 0 && shard.offset >= 0 && shard.offset + width <= shard.classes,
             "{}: a class shard [{}, {} + {}) must lie within its {} classes (logits shape {})", op,
             shard.offset, shard.offset, width, shard.classes, shape_str(logits.shape()));
}

void check_reduction(Reduction reduction, std::string_view op) {
  const auto value = static_cast<int64_t>(reduction);
  LOOM_CHECK(value >= 0 && value <= 2,
             "{}: unknown reduction {} (expected 0 = none, 1 = mean, 2 = sum)", op, value);
}

// Checks logits (N, V) and targets (N,): dtypes and shapes, not the targets' values.
void check_logits_and_targets(const Tensor& logits, const Tensor& targets, std::string_view op) {
  check_floating(logits, op, "logits");
  check_index(targets, op, "targets");
  LOOM_CHECK(logits.dim() == 2, "{}: expected logits of shape (N, V), got shape {}", op,
             shape_str(logits.shape()));
  const int64_t n = logits.size(0);
  LOOM_CHECK(targets.shape() == Shape{n},
             "{}: targets shape {} does not match logits shape {} (expected ({},))", op,
             shape_str(targets.shape()), shape_str(logits.shape()), n);
}

// On the host (a CPU's logits): every target against the number of classes (V unless the logits
// are a shard of `classes`); returns the targets.
std::vector<int64_t> checked_targets(const Tensor& logits, const Tensor& targets,
                                     int64_t ignore_index, std::string_view op,
                                     int64_t classes = 0) {
  const int64_t n = logits.size(0), v = classes > 0 ? classes : logits.size(1);
  std::vector<int64_t> t = index_values(targets);
  for (int64_t row = 0; row < n; ++row) {
    LOOM_CHECK(t[row] == ignore_index || (t[row] >= 0 && t[row] < v), "{}",
               target_message(t[row], row, v, logits.shape(), ignore_index, op));
  }
  return t;
}

// The targets of a GPU's logits, checked by the kernel that reads them.
int64_t* begin_target_check(const Tensor& targets_dev, const Tensor& logits, int64_t ignore_index,
                            std::string_view op, int64_t classes = 0) {
  const int64_t v = classes > 0 ? classes : logits.size(1);
  return begin_index_check(targets_dev, [=, shape = logits.shape()](int64_t value, int64_t row) {
    return target_message(value, row, v, shape, ignore_index, op);
  });
}

// log(sum(exp(row))) of each row of a contiguous f32 (N, V) tensor, max-subtracted. A row with
// no finite-or-+inf entry (empty, or all -inf: a class shard whose classes are all masked) is
// -inf, not the NaN of exp(-inf - -inf): loss parallel combines it with the other shards' rows.
std::vector<float> row_logsumexp(const float* x, int64_t n, int64_t v) {
  std::vector<float> lse(n);
  for (int64_t row = 0; row < n; ++row) {
    const float* xr = x + row * v;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < v; ++j) m = std::max(m, xr[j]);
    if (m == -std::numeric_limits<float>::infinity()) {
      lse[row] = m;
      continue;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < v; ++j) sum += std::exp(xr[j] - m);
    lse[row] = m + static_cast<float>(std::log(sum));
  }
  return lse;
}

// x * mask * scale elementwise (x any floating dtype, mask f32 of x's shape), in x's dtype.
Tensor masked_scale(const Tensor& x_in, const Tensor& mask_in, float scale) {
  const Device device = op_device("dropout", {x_in, mask_in});
  if (device.is_meta() && !allocates_like_cpu(device)) {
    return Tensor::empty(x_in.shape(), x_in.dtype(), device);
  }
  if (device.is_cuda()) {
    // f32 arithmetic, one rounding to x's dtype (the 0/1 mask converts exactly).
    Tensor out = Tensor::empty(x_in.shape(), x_in.dtype(), x_in.device());
    cuda_backend::binary(cuda::kernels::BinaryOp::kMulScaled, out, x_in, to(mask_in, x_in.dtype()),
                         scale);
    return out;
  }
  const Tensor x = as_f32(x_in);
  const Tensor mask = as_f32(mask_in);
  Tensor out = Tensor::empty(x.shape(), kFloat32, device);
  if (device.is_meta()) return to(out, x_in.dtype());  // the CPU's allocations, no values
  const float* px = x.data<float>();
  const float* pm = mask.data<float>();
  float* po = out.data<float>();
  const int64_t count = x.numel();
  for (int64_t i = 0; i < count; ++i) po[i] = px[i] * pm[i] * scale;
  return to(out, x_in.dtype());
}

// The targets that are not ignore_index, counted on the device: the mean's divisor (int64, 0-dim).
Tensor cuda_count_targets(const Tensor& targets_dev, int64_t ignore_index) {
  Tensor count = Tensor::empty({}, kInt64, targets_dev.device());
  cuda::kernels::count_targets(count.data<int64_t>(), targets_dev.data<int64_t>(),
                               targets_dev.numel(), ignore_index, targets_dev.device().index);
  return count;
}

// Cross entropy of logits `x` (n, v, contiguous, in their own floating dtype) on a GPU. The
// kernel checks the targets (device_checks.h: a bad one is reported at the next synchronization),
// so the host never reads them. The loss is f32; sums and the mean's division run on the device.
CrossEntropyResult cuda_cross_entropy(const Tensor& x, const Tensor& targets, int64_t ignore_index,
                                      Reduction reduction, std::string_view op,
                                      const ClassShard& shard = {}) {
  const int64_t n = x.size(0), v = x.size(1);
  const int device = x.device().index;
  const Tensor targets_dev = contiguous(to(targets, kInt64));
  Tensor lse = Tensor::empty({n}, kFloat32, x.device());
  Tensor losses = Tensor::empty({n}, kFloat32, x.device());
  int64_t* first_bad = begin_target_check(targets_dev, x, ignore_index, op, shard.classes);
  cuda::kernels::cross_entropy_forward(
      x.dtype(), lse.data<float>(), losses.data<float>(), x.raw_data(), targets_dev.data<int64_t>(),
      n, v, shard.offset, shard.classes, ignore_index, first_bad, device);
  if (reduction == Reduction::kNone) return {losses, lse};
  Tensor total = cuda_backend::sum(losses, {true}, /*keepdim=*/false, 1.0);
  if (reduction == Reduction::kMean) {
    // With every row ignored this is 0 / 0 = NaN, as on the CPU and in PyTorch.
    const Tensor count = cuda_count_targets(targets_dev, ignore_index);
    cuda::kernels::divide_by_count(total.data<float>(), count.data<int64_t>(), device);
  }
  return {total, lse};
}

void check_dropout_p(double p, const Tensor& t, std::string_view op) {
  LOOM_CHECK(p >= 0.0 && p <= 1.0, "{}: p must be in [0, 1], got {} (input shape {})", op, p,
             shape_str(t.shape()));
}

}  // namespace

// ---- embedding --------------------------------------------------------------------------------

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  if (auto out = dispatch_op(OpId::embedding, {weight, indices})) return std::move((*out)[0]);
  constexpr std::string_view op = "embedding";
  check_floating(weight, op, "weight");
  check_index(indices, op, "indices");
  LOOM_CHECK(weight.dim() == 2, "{}: expected weight of shape (V, C), got shape {}", op,
             shape_str(weight.shape()));
  const int64_t v = weight.size(0), c = weight.size(1);
  const Device device = op_device(op, {weight, indices});
  Shape out_shape = indices.shape();
  out_shape.push_back(c);
  Tensor out = Tensor::empty(out_shape, weight.dtype(), device);
  if (device.is_meta()) return out;  // the indices are not known: nothing to check
  if (device.is_cuda()) {
    // The kernel checks the indices (device_checks.h): no copy to the host, no synchronization.
    const Tensor idx_dev = contiguous(to(indices, kInt64));
    int64_t* first_bad = begin_embedding_index_check(idx_dev, indices.shape(), v, op);
    cuda::kernels::embedding_forward(weight.dtype(), out.raw_data(), weight.raw_data(),
                                     weight.stride(0), weight.stride(1), idx_dev.data<int64_t>(),
                                     idx_dev.numel(), c, v, first_bad, device.index);
    return out;
  }
  const std::vector<int64_t> idx = index_values(indices);
  // A byte copy per row: the values keep their dtype, so no conversion is involved.
  const size_t elem = element_size(weight.dtype());
  const char* w = static_cast<const char*>(weight.raw_data());
  char* o = static_cast<char*>(out.raw_data());
  const int64_t row_stride = weight.stride(0), col_stride = weight.stride(1);
  for (size_t i = 0; i < idx.size(); ++i) {
    check_embedding_index(idx[i], static_cast<int64_t>(i), indices, v, op);
    const char* src = w + idx[i] * row_stride * static_cast<int64_t>(elem);
    char* dst = o + static_cast<int64_t>(i) * c * static_cast<int64_t>(elem);
    if (col_stride == 1 || c == 1) {
      std::memcpy(dst, src, c * elem);
    } else {
      for (int64_t j = 0; j < c; ++j)
        std::memcpy(dst + j * elem, src + j * col_stride * elem, elem);
    }
  }
  return out;
}

Tensor embedding_backward(const Tensor& grad_out, const Tensor& indices, int64_t num_embeddings,
                          const Tensor& weight) {
  if (auto out =
          dispatch_op(OpId::embedding_backward, {grad_out, indices, weight}, {num_embeddings})) {
    return std::move((*out)[0]);
  }
  constexpr std::string_view op = "embedding_backward";
  check_floating(grad_out, op, "grad_out");
  check_index(indices, op, "indices");
  LOOM_CHECK(num_embeddings >= 0, "{}: num_embeddings must be >= 0, got {}", op, num_embeddings);
  const bool fits =
      grad_out.dim() == indices.dim() + 1 &&
      std::equal(indices.shape().begin(), indices.shape().end(), grad_out.shape().begin());
  LOOM_CHECK(fits, "{}: grad_out shape {} is not (*indices.shape, C) for indices shape {}", op,
             shape_str(grad_out.shape()), shape_str(indices.shape()));
  const int64_t c = grad_out.size(-1);
  const Device device = op_device(op, {grad_out, indices});
  if (device.is_meta()) {
    if (allocates_like_cpu(device)) {  // grad_out's rows, the f32 accumulator, its dtype's copy
      const Tensor g = contiguous(grad_out);
      return to(Tensor::empty({num_embeddings, c}, kFloat32, device), grad_out.dtype());
    }
    // A GPU's sort keys, and beside them the gradient in its dtype.
    const Tensor keys =
        Tensor::empty({cuda::kernels::embedding_backward_keys(indices.numel())}, kInt64, device);
    return Tensor::empty({num_embeddings, c}, grad_out.dtype(), device);
  }
  if (device.is_cuda()) {
    const Tensor idx_dev = contiguous(to(indices, kInt64));
    const int64_t count = idx_dev.numel();
    LOOM_CHECK(count < (int64_t{1} << 32) && num_embeddings < (int64_t{1} << 31),
               "{}: {} indices into {} rows; a GPU takes fewer than 2^32 indices and 2^31 rows", op,
               count, num_embeddings);
    int64_t* first_bad = begin_embedding_index_check(idx_dev, indices.shape(), num_embeddings, op);
    const Tensor g = contiguous(grad_out);
    Tensor keys = Tensor::empty({cuda::kernels::embedding_backward_keys(count)}, kInt64, device);
    Tensor grad_w = Tensor::empty({num_embeddings, c}, grad_out.dtype(), device);
    cuda::kernels::embedding_backward(grad_out.dtype(), grad_w.raw_data(), g.raw_data(),
                                      idx_dev.data<int64_t>(), count, c, num_embeddings,
                                      keys.data<int64_t>(), first_bad, device.index);
    return grad_w;
  }
  // grad_out read in its own dtype (no f32 copy of a bf16 gradient: in the experts' dispatch it
  // is every routed token's row), summed into an f32 accumulator.
  const Tensor g = contiguous(grad_out);
  Tensor grad_w = zeros({num_embeddings, c}, kFloat32, device);
  float* pw = grad_w.data<float>();
  const std::vector<int64_t> idx = index_values(indices);
  cpu::visit_floating_dtype(g.dtype(), "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* pg = static_cast<const T*>(g.raw_data());
    for (size_t i = 0; i < idx.size(); ++i) {
      check_embedding_index(idx[i], static_cast<int64_t>(i), indices, num_embeddings, op);
      float* dst = pw + idx[i] * c;
      const T* src = pg + static_cast<int64_t>(i) * c;
      for (int64_t j = 0; j < c; ++j) dst[j] += cpu::to_compute(src[j]);
    }
  });
  return to(grad_w, grad_out.dtype());
}

// ---- cross entropy ----------------------------------------------------------------------------

CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                 Reduction reduction, const ClassShard& shard) {
  if (auto r = dispatch_op(
          OpId::cross_entropy, {logits, targets},
          {ignore_index, static_cast<int64_t>(reduction), shard.offset, shard.classes})) {
    return {(*r)[0], (*r)[1]};
  }
  constexpr std::string_view op = "cross_entropy";
  check_reduction(reduction, op);
  check_class_shard(logits, shard, op);
  LOOM_CHECK(shard.classes == 0 || reduction == Reduction::kNone,
             "{}: a class shard's loss is per row (reduction none), got reduction {}", op,
             static_cast<int64_t>(reduction));
  const Device device = op_device(op, {logits, targets});
  if (device.is_meta()) {  // the targets are not known: shapes only
    // A CPU computes in an f32 copy of bf16 logits; a GPU reads them as they are.
    const Tensor staged = allocates_like_cpu(device) ? as_f32(logits) : logits;
    const int64_t rows = logits.size(0);
    const Tensor lse = Tensor::empty({rows}, kFloat32, device);
    const Shape loss_shape = reduction == Reduction::kNone ? Shape{rows} : Shape{};
    return {Tensor::empty(loss_shape, kFloat32, device), lse};
  }
  check_logits_and_targets(logits, targets, op);
  if (device.is_cuda())
    return cuda_cross_entropy(contiguous(logits), targets, ignore_index, reduction, op, shard);
  const std::vector<int64_t> t = checked_targets(logits, targets, ignore_index, op, shard.classes);
  const int64_t n = logits.size(0), v = logits.size(1);
  const Tensor x = as_f32(logits);
  const float* px = x.data<float>();
  const std::vector<float> lse = row_logsumexp(px, n, v);
  Tensor lse_out = Tensor::empty({n}, kFloat32);
  std::copy(lse.begin(), lse.end(), lse_out.data<float>());
  std::vector<float> losses(n, 0.0f);
  double total = 0.0;
  int64_t count = 0;
  for (int64_t row = 0; row < n; ++row) {
    if (t[row] == ignore_index) continue;
    if (shard.classes > 0) {  // this shard's part: the target's negative logit where it is here
      const int64_t here = t[row] - shard.offset;
      if (here >= 0 && here < v) losses[row] = -px[row * v + here];
      continue;
    }
    losses[row] = lse[row] - px[row * v + t[row]];
    total += losses[row];
    ++count;
  }
  Tensor loss;
  if (reduction == Reduction::kNone) {
    loss = Tensor::empty({n}, kFloat32);
    std::copy(losses.begin(), losses.end(), loss.data<float>());
  } else {
    // kMean with every row ignored is 0 / 0 = NaN, as in PyTorch.
    const double value = reduction == Reduction::kSum ? total : total / static_cast<double>(count);
    loss = scalar_tensor(value, kFloat32);
  }
  return {loss, lse_out};
}

Tensor cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& targets,
                              int64_t ignore_index, Reduction reduction, const Tensor& logsumexp,
                              const ClassShard& shard, bool over_logits) {
  std::vector<OpAttr> attrs{ignore_index, static_cast<int64_t>(reduction), shard.offset,
                            shard.classes};
  if (over_logits) attrs.emplace_back(true);
  if (auto r = dispatch_op(OpId::cross_entropy_backward, {grad_loss, logits, targets, logsumexp},
                           std::move(attrs))) {
    return (*r)[0];
  }
  constexpr std::string_view op = "cross_entropy_backward";
  check_reduction(reduction, op);
  check_class_shard(logits, shard, op);
  LOOM_CHECK(logsumexp.defined() || shard.classes == 0,
             "{}: a class shard needs the whole rows' logsumexp", op);
  check_floating(grad_loss, op, "grad_loss");
  if (const Device device = op_device(op, {grad_loss, logits, targets, logsumexp});
      device.is_meta()) {
    // A CPU: an f32 copy of bf16 logits, the f32 gradient, then the logits' dtype; a GPU writes
    // the gradient in the logits' dtype directly (over contiguous logits when asked).
    const bool in_place = over_logits && logits.is_contiguous();
    if (!allocates_like_cpu(device)) {
      return in_place ? alias(logits) : Tensor::empty(logits.shape(), logits.dtype(), device);
    }
    if (in_place && logits.dtype() == kFloat32) return alias(logits);
    const Tensor staged = as_f32(logits);
    const Tensor grad = Tensor::empty(logits.shape(), kFloat32, device);
    return in_place ? alias(logits) : to(grad, logits.dtype());
  }
  check_logits_and_targets(logits, targets, op);
  const int64_t n = logits.size(0), v = logits.size(1);
  if (reduction == Reduction::kNone) {
    LOOM_CHECK(grad_loss.shape() == Shape{n},
               "{}: with reduction none grad_loss must have shape ({},), got {} (logits shape {})",
               op, n, shape_str(grad_loss.shape()), shape_str(logits.shape()));
  } else {
    LOOM_CHECK(grad_loss.numel() == 1,
               "{}: with reduction mean/sum grad_loss must have one element, got shape {} "
               "(logits shape {})",
               op, shape_str(grad_loss.shape()), shape_str(logits.shape()));
  }
  const Device device = op_device(op, {grad_loss, logits, targets, logsumexp});
  if (device.is_cuda()) {
    if (logsumexp.defined()) {
      LOOM_CHECK(logsumexp.shape() == Shape{n},
                 "{}: logsumexp shape {} does not match logits shape {} (expected ({},))", op,
                 shape_str(logsumexp.shape()), shape_str(logits.shape()), n);
    }
    const Tensor x = contiguous(logits);
    const Tensor lse =
        logsumexp.defined()
            ? as_f32(logsumexp)
            : cuda_cross_entropy(x, targets, ignore_index, Reduction::kNone, op).logsumexp;
    const Tensor targets_dev = contiguous(to(targets, kInt64));
    const Tensor count =
        reduction == Reduction::kMean ? cuda_count_targets(targets_dev, ignore_index) : Tensor();
    const Tensor gl = as_f32(on_device(grad_loss, device));
    // Over the logits when asked: each element is read, then written, by one thread.
    Tensor grad = over_logits ? x : Tensor::empty({n, v}, x.dtype(), device);
    int64_t* first_bad = begin_target_check(targets_dev, x, ignore_index, op, shard.classes);
    cuda::kernels::cross_entropy_backward(
        x.dtype(), grad.raw_data(), x.raw_data(), lse.data<float>(), targets_dev.data<int64_t>(),
        gl.data<float>(), n, v, shard.offset, shard.classes, ignore_index,
        static_cast<int>(reduction), count.defined() ? count.data<int64_t>() : nullptr, first_bad,
        device.index);
    return over_logits ? alias(grad) : grad;  // a new handle: none of the logits' autograd state
  }
  const std::vector<int64_t> t = checked_targets(logits, targets, ignore_index, op, shard.classes);
  const Tensor x = as_f32(logits);
  const float* px = x.data<float>();
  std::vector<float> lse;
  if (logsumexp.defined()) {
    check_floating(logsumexp, op, "logsumexp");
    LOOM_CHECK(logsumexp.shape() == Shape{n},
               "{}: logsumexp shape {} does not match logits shape {} (expected ({},))", op,
               shape_str(logsumexp.shape()), shape_str(logits.shape()), n);
    const Tensor l = as_f32(logsumexp);
    lse.assign(l.data<float>(), l.data<float>() + n);
  } else {
    lse = row_logsumexp(px, n, v);
  }
  const Tensor gl = as_f32(grad_loss);
  const float* pgl = gl.data<float>();
  int64_t count = 0;
  for (int64_t row = 0; row < n; ++row) count += t[row] != ignore_index;
  // Over f32 logits when asked (x is then logits itself: each element read, then written).
  const bool in_place = over_logits && x.storage() == logits.storage();
  Tensor grad = in_place ? x : Tensor::empty({n, v}, kFloat32);
  float* pd = grad.data<float>();
  for (int64_t row = 0; row < n; ++row) {
    float* dr = pd + row * v;
    if (t[row] == ignore_index) {
      std::fill(dr, dr + v, 0.0f);
      continue;
    }
    float scale = 0.0f;
    switch (reduction) {
      case Reduction::kNone:
        scale = pgl[row];
        break;
      case Reduction::kSum:
        scale = pgl[0];
        break;
      case Reduction::kMean:
        scale = static_cast<float>(pgl[0] / static_cast<double>(count));
        break;
    }
    const float* xr = px + row * v;
    for (int64_t j = 0; j < v; ++j) dr[j] = std::exp(xr[j] - lse[row]) * scale;
    // The one-hot, when this shard holds the target's class.
    if (const int64_t here = t[row] - shard.offset; here >= 0 && here < v) dr[here] -= scale;
  }
  // Over the logits: a new handle on their memory, without their autograd state.
  if (in_place) return alias(grad);
  if (over_logits && logits.is_contiguous()) {  // bf16 or f16 logits: the f32 gradient rounded in
    copy_(logits, grad);
    return alias(logits);
  }
  return to(grad, logits.dtype());
}

// ---- dropout ----------------------------------------------------------------------------------

RngRegion dropout_region_of(const OpCall& call) {
  if (call.attrs.size() <= 3) return {};
  RngRegion region{call.ints_attr(3), call.ints_attr(4)};
  if (call.attrs.size() > 5) {  // runs: (runs_dim, then the triples), as dropout() appends them
    const std::vector<int64_t>& runs = call.ints_attr(5);
    region.runs_dim = runs.at(0);
    region.runs.assign(runs.begin() + 1, runs.end());
  }
  return region;
}

DropoutResult dropout(const Tensor& x, double p, uint64_t seed, bool training,
                      const RngRegion& region) {
  std::vector<OpAttr> attrs{p, static_cast<int64_t>(seed), training};
  // The region travels with the call (autograd and DTensor's strategy call this again from it).
  if (!region.empty()) attrs.insert(attrs.end(), {region.global_shape, region.global_offset});
  if (!region.runs.empty()) {
    std::vector<int64_t> runs{region.runs_dim};
    runs.insert(runs.end(), region.runs.begin(), region.runs.end());
    attrs.emplace_back(std::move(runs));
  }
  if (auto r = dispatch_op(OpId::dropout, {x}, std::move(attrs))) return {(*r)[0], (*r)[1]};
  constexpr std::string_view op = "dropout";
  check_floating(x, op, "x");
  check_dropout_p(p, x, op);
  if (!training || p == 0.0) return {x, Tensor()};
  Tensor mask = bernoulli_keep_mask(x.shape(), seed, p, region, x.device());
  if (p == 1.0) return {zeros(x.shape(), x.dtype(), x.device()), mask};
  return {masked_scale(x, mask, static_cast<float>(1.0 / (1.0 - p))), mask};
}

Tensor dropout_backward(const Tensor& grad, const Tensor& mask, double p) {
  if (auto r = dispatch_op(OpId::dropout_backward, {grad, mask}, {p})) return (*r)[0];
  constexpr std::string_view op = "dropout_backward";
  check_floating(grad, op, "grad");
  check_dropout_p(p, grad, op);
  if (!mask.defined()) return grad;
  check_floating(mask, op, "mask");
  LOOM_CHECK(mask.shape() == grad.shape(), "{}: mask shape {} does not match grad shape {}", op,
             shape_str(mask.shape()), shape_str(grad.shape()));
  if (p == 1.0) return zeros(grad.shape(), grad.dtype(), grad.device());
  return masked_scale(grad, mask, static_cast<float>(1.0 / (1.0 - p)));
}

}  // namespace loom::ops
