#include "tensor/ops_foreach.h"

#include <optional>
#include <vector>

#include "base/error.h"
#include "base/profiler.h"
#include "tensor/cuda/kernels/foreach.h"
#include "tensor/flop_counter.h"
#include "tensor/ops_copy.h"
#include "tensor/ops_create.h"
#include "tensor/ops_elementwise.h"
#include "tensor/ops_reduce.h"
#include "tensor/ops_views.h"

namespace loom::ops {
namespace {

// The one device of every tensor; nullopt for an empty list.
std::optional<Device> common_device(std::span<const Tensor> tensors, const char* op) {
  std::optional<Device> device;
  for (size_t i = 0; i < tensors.size(); ++i) {
    LOOM_CHECK(tensors[i].defined(), "{}: tensor {} is undefined", op, i);
    const Device d = tensors[i].device();
    if (!device) device = d;
    LOOM_CHECK(d == *device, "{}: tensor 0 is on {} and tensor {} on {}; give one device's tensors",
               op, device->str(), i, d.str());
  }
  return device;
}

// Whether a multi-tensor kernel takes it: a plain contiguous f32 tensor.
bool fusable(const Tensor& t) {
  return !t.extension() && t.dtype() == kFloat32 && t.is_contiguous();
}

// sum(x^2) of x as f32, as a (1,) tensor where x lives.
Tensor composed_square_sum(const Tensor& t) {
  const Tensor x = to(t, kFloat32);
  return reshape(sum(mul(x, x)), {1});
}

}  // namespace

Tensor foreach_sum_of_squares(std::span<const Tensor> tensors) {
  constexpr const char* op = "foreach_sum_of_squares";
  const std::optional<Device> device = common_device(tensors, op);
  if (!device) return Tensor::empty({0}, kFloat32);
  const int64_t n = static_cast<int64_t>(tensors.size());
  if (allocates_like_cpu(*device)) {
    std::vector<Tensor> sums;
    sums.reserve(tensors.size());
    for (const Tensor& t : tensors) sums.push_back(composed_square_sum(t));
    return cat(sums, 0);
  }
  // One entry per tensor, so the kernel's sum of entry i lands at out[i]; a tensor the kernel
  // does not take is an empty entry (left out of the launches) and composed below.
  std::vector<cuda::kernels::ForeachTensor> entries(tensors.size());
  std::vector<int64_t> composed_index;
  for (int64_t i = 0; i < n; ++i) {
    const Tensor& t = tensors[i];
    if (!fusable(t)) {
      composed_index.push_back(i);
      continue;
    }
    FlopCounter::record_in_place(t, 1);  // read once, nothing written but the sums
    entries[i] = {.data = device->is_cuda() ? t.data<float>() : nullptr, .n = t.numel()};
  }
  Tensor out = zeros({n}, kFloat32, *device);
  Tensor partials =
      Tensor::empty({cuda::kernels::foreach_chunks(entries.data(), n)}, kFloat32, *device);
  if (device->is_cuda()) {
    cuda::kernels::foreach_sum_of_squares(entries.data(), n, out.data<float>(),
                                          partials.data<float>(), device->index);
  }
  for (int64_t i : composed_index) copy_(narrow(out, 0, i, 1), composed_square_sum(tensors[i]));
  return out;
}

void foreach_mul_(std::span<const Tensor> tensors, double scalar) {
  const std::optional<Device> device = common_device(tensors, "foreach_mul_");
  if (!device || allocates_like_cpu(*device)) {
    for (const Tensor& t : tensors) mul_(t, scalar);
    return;
  }
  std::vector<cuda::kernels::ForeachTensor> fused;
  for (const Tensor& t : tensors) {
    if (!fusable(t)) {
      mul_(t, scalar);
      continue;
    }
    FlopCounter::record_in_place(t, 2);  // as mul_ counts it
    if (device->is_cuda()) fused.push_back({.data = t.data<float>(), .n = t.numel()});
  }
  // A trace for a GPU (meta) counts the pass and allocates nothing, as the kernel.
  if (device->is_cuda()) {
    cuda::kernels::foreach_mul(fused.data(), static_cast<int64_t>(fused.size()),
                               static_cast<float>(scalar), device->index);
  }
}

std::vector<Tensor> foreach_to(std::span<const Tensor> tensors, DType dtype) {
  const profiler::Scope scope("foreach_to");  // one op in the op table, the casts inside it
  const std::optional<Device> device = common_device(tensors, "foreach_to");
  std::vector<Tensor> out(tensors.size());
  const bool fused_dtype = dtype == kBFloat16 || dtype == kFloat16;
  std::vector<cuda::kernels::ForeachCast> fused;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (!device || allocates_like_cpu(*device) || !fused_dtype || !fusable(t)) {
      out[i] = to(t, dtype);
      continue;
    }
    // As to() makes it: a new tensor, the copy uncounted (a trace for a GPU allocates the same).
    out[i] = Tensor::empty(t.shape(), dtype, *device);
    if (device->is_cuda()) {
      fused.push_back({.in = t.data<float>(), .out = out[i].raw_data(), .n = t.numel()});
    }
  }
  if (!fused.empty()) {
    cuda::kernels::foreach_cast_from_f32(fused.data(), static_cast<int64_t>(fused.size()), dtype,
                                         device->index);
  }
  return out;
}

}  // namespace loom::ops
