#include "tensor/ops_create.h"

#include <cmath>

#include "base/error.h"
#include "tensor/cpu/element_types.h"
#include "tensor/cpu/strided_loop.h"
#include "tensor/cpu/vector_math.h"
#include "tensor/dispatch.h"
#include "tensor/element.h"
#include "tensor/flop_counter.h"
#include "tensor/ops_copy.h"
#include "tensor/ops_cuda.h"

namespace loom::ops {

Tensor empty(const Shape& shape, DType dtype, Device device) {
  return Tensor::empty(shape, dtype, device);
}

namespace {

void fill_plain(const Tensor& self, double value) {
  // Meta storage that keeps values is host memory (tensor/device.h); other meta storage has none.
  if (self.device().is_meta() && self.storage()->data() == nullptr) return;
  if (self.device().is_cuda()) {
    cuda_backend::fill(self, value);
    return;
  }
  if (self.dtype() == kFloat32 && self.is_contiguous()) {  // vectorized, threaded
    cpu::fill_f32(self.data<float>(), static_cast<float>(value), self.numel());
    return;
  }
  cpu::visit_dtype(self.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T stored = cpu::from_compute<T>(value);
    T* data = static_cast<T*>(self.raw_data());
    cpu::parallel_for_each_run<1>(self.shape(), {self.strides()},
                                  [&](const auto& offsets, int64_t count, const auto& inner) {
                                    for (int64_t j = 0; j < count; ++j)
                                      data[offsets[0] + j * inner[0]] = stored;
                                  });
  });
}

}  // namespace

void fill_(const Tensor& self, double value) {
  if (dispatch_op(OpId::fill_, {self}, {value})) return;
  FlopCounter::record_in_place(self, 1);
  fill_plain(self, value);
}

void fill_uncounted_(const Tensor& self, double value) {
  if (dispatch_op(OpId::fill_, {self}, {value})) return;
  fill_plain(self, value);
}

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor out = Tensor::empty(shape, dtype, device);
  fill_uncounted_(out, value);  // a new tensor: its allocation already counts its bytes
  return out;
}

Tensor zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}
Tensor ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}
// The *_like factories dispatch, so a DTensor `like` gives a DTensor with its layout.
Tensor zeros_like(const Tensor& like) {
  if (auto out = dispatch_op(OpId::zeros_like, {like})) return std::move((*out)[0]);
  return zeros(like.shape(), like.dtype(), like.device());
}
Tensor ones_like(const Tensor& like) {
  if (auto out = dispatch_op(OpId::ones_like, {like})) return std::move((*out)[0]);
  return ones(like.shape(), like.dtype(), like.device());
}

Tensor arange(double start, double end, double step, DType dtype) {
  LOOM_CHECK(step != 0, "arange: step must be non-zero");
  LOOM_CHECK((end - start) / step >= 0, "arange: range [{}, {}) with step {} goes the wrong way",
             start, end, step);
  const int64_t count = static_cast<int64_t>(std::ceil((end - start) / step));
  Tensor out = Tensor::empty({count}, dtype);
  for (int64_t i = 0; i < count; ++i) {
    store_element(static_cast<char*>(out.raw_data()) + i * element_size(dtype), dtype,
                  start + step * static_cast<double>(i));
  }
  return out;
}

Tensor arange(int64_t end, DType dtype) {
  return arange(0.0, static_cast<double>(end), 1.0, dtype);
}

Tensor from_vector(const std::vector<float>& values, const Shape& shape, DType dtype) {
  LOOM_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
             "from_vector: {} values cannot fill shape {} ({} elements)", values.size(),
             shape_str(shape), shape_numel(shape));
  Tensor out = Tensor::empty(shape, dtype);
  for (size_t i = 0; i < values.size(); ++i) {
    store_element(static_cast<char*>(out.raw_data()) + i * element_size(dtype), dtype, values[i]);
  }
  return out;
}

Tensor from_vector_i64(const std::vector<int64_t>& values, const Shape& shape, Device device) {
  LOOM_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
             "from_vector_i64: {} values cannot fill shape {} ({} elements)", values.size(),
             shape_str(shape), shape_numel(shape));
  Tensor out = Tensor::empty(shape, kInt64);
  std::copy(values.begin(), values.end(), out.data<int64_t>());
  return to(out, device);
}

Tensor scalar_tensor(double value, DType dtype) { return full({}, value, dtype); }

std::vector<double> to_vector(const Tensor& self) {
  LOOM_CHECK(self.defined(), "to_vector: the tensor is undefined (a gradient not computed yet?)");
  if (self.extension()) return to_vector(self.extension()->whole());  // a DTensor's whole values
  const Tensor host = contiguous(to(self, Device::cpu()));
  std::vector<double> values(host.numel());
  const size_t size = element_size(host.dtype());
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] =
        host.dtype() == kInt64
            ? static_cast<double>(static_cast<const int64_t*>(host.raw_data())[i])
            : load_element(static_cast<const char*>(host.raw_data()) + i * size, host.dtype());
  }
  return values;
}

}  // namespace loom::ops
