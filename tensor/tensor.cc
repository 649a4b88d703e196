#include "tensor/tensor.h"

#include <fmt/format.h>

#include "base/error.h"
#include "tensor/element.h"
#include "tensor/ops_copy.h"

namespace loom {

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t size : shape) {
    LOOM_CHECK(size >= 0, "empty: negative size in shape {}", shape_str(shape));
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage =
      Storage::allocate(static_cast<size_t>(shape_numel(shape)) * element_size(dtype), device);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::from_storage(std::shared_ptr<Storage> storage, Shape shape, Strides strides,
                            int64_t offset, DType dtype) {
  LOOM_INTERNAL_ASSERT(shape.size() == strides.size());
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

int64_t Tensor::size(int64_t dim) const {
  const int64_t d = normalize_dim(dim, this->dim(), "size");
  // normalize_dim accepts dim 0 / -1 on a scalar (wrap_scalar), but there is no size to read.
  LOOM_CHECK(this->dim() > 0,
             "size: dim {} out of range for a tensor of rank 0 (a scalar has no dims)", dim);
  return impl_->shape[d];
}

int64_t Tensor::stride(int64_t dim) const {
  const int64_t d = normalize_dim(dim, this->dim(), "stride");
  LOOM_CHECK(this->dim() > 0,
             "stride: dim {} out of range for a tensor of rank 0 (a scalar has no dims)", dim);
  return impl_->strides[d];
}

bool Tensor::is_contiguous() const {
  // An empty tensor has no element out of place (as in PyTorch); Tensor::empty of a shape with
  // a 0 dim has strides from contiguous_strides that the loop below would reject.
  if (numel() == 0) return true;
  int64_t expected = 1;
  for (size_t i = impl_->shape.size(); i-- > 0;) {
    if (impl_->shape[i] == 1) continue;
    if (impl_->strides[i] != expected) return false;
    expected *= impl_->shape[i];
  }
  return true;
}

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  LOOM_CHECK(impl_ != nullptr, "set_requires_grad: tensor is undefined");
  LOOM_CHECK(!requires_grad || is_floating(dtype()),
             "set_requires_grad: only floating tensors can require grad, got dtype {}",
             dtype_name(dtype()));
  LOOM_CHECK(is_leaf(),
             "set_requires_grad: can only be set on a leaf tensor; this one was produced by an op "
             "(use detach() to make a leaf)");
  impl_->requires_grad = requires_grad;
  return *this;
}

std::string Tensor::description() const {
  if (!defined()) return "Tensor(undefined)";
  return fmt::format("Tensor(shape={}, dtype={}, device={})", shape_str(shape()),
                     dtype_name(dtype()), device().str());
}

void check_data_dtype(const Tensor& tensor, DType requested) {
  LOOM_CHECK(tensor.defined(), "data: tensor is undefined");
  LOOM_CHECK(tensor.dtype() == requested, "data: tensor has dtype {} but {} was requested",
             dtype_name(tensor.dtype()), dtype_name(requested));
}

Tensor TensorExtension::whole() const {
  LOOM_FAIL("a tensor extension of kind {} cannot give its whole values on this process", kind());
}

void fail_raw_data_of_wrapper(const Tensor& tensor) {
  LOOM_FAIL(
      "raw_data/data: {} is a wrapper (a DTensor) whose bytes on this process are only its "
      "local shard, not the {} elements its shape holds; read its local shard (to_local) or its "
      "whole values (full_tensor, item, ops::to_vector)",
      tensor.description(), tensor.numel());
}

template <typename T>
T Tensor::item() const {
  LOOM_CHECK(defined() && numel() == 1, "item: expected a tensor with one element, got shape {}",
             defined() ? shape_str(shape()) : "undefined");
  // A DTensor's value is the whole tensor's (a Partial sum reduced, a shard gathered), as torch's
  // item() of a DTensor; collective over its mesh.
  if (extension()) return extension()->whole().item<T>();
  // A device tensor is copied to the host first (which waits for the device), as torch does.
  if (!device().is_cpu()) return ops::to(*this, Device::cpu()).item<T>();
  // i64 is read directly: a double holds only 53 bits of it.
  if (dtype() == kInt64) return static_cast<T>(*static_cast<const int64_t*>(raw_data()));
  return static_cast<T>(load_element(raw_data(), dtype()));
}

template float Tensor::item<float>() const;
template double Tensor::item<double>() const;
template int32_t Tensor::item<int32_t>() const;
template int64_t Tensor::item<int64_t>() const;

}  // namespace loom
