// Tensor: a handle to shared storage viewed through shape, strides and an element offset.
//
// Copying a Tensor copies the handle (like torch.Tensor in Python): both names see the same
// data and the same autograd state. Views (tensor/ops_views.h) share storage without copying.
//
// This layer knows nothing of autograd's graph or of DTensor; it only holds their state:
//   - requires_grad / grad / grad_fn: data the autograd engine (autograd/) reads and writes.
//   - extension(): an opaque object a higher layer attaches (dtensor/ attaches its spec and
//     local shard); ops whose inputs carry one are routed to that layer (tensor/dispatch.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "tensor/device.h"
#include "tensor/dtype.h"
#include "tensor/shape.h"
#include "tensor/storage.h"

namespace loom {

namespace autograd {
class Node;
struct AutogradMeta;
}  // namespace autograd

class TensorExtension;
struct TensorImpl;

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // A fresh contiguous tensor with uninitialized contents.
  static Tensor empty(const Shape& shape, DType dtype = kFloat32, Device device = Device::cpu());
  // A tensor viewing `storage` (no copy).
  static Tensor from_storage(std::shared_ptr<Storage> storage, Shape shape, Strides strides,
                             int64_t offset, DType dtype);

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  int64_t size(int64_t dim) const;  // negative dims count from the end
  const Strides& strides() const;
  int64_t stride(int64_t dim) const;
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t numel() const;
  int64_t offset() const;
  DType dtype() const;
  Device device() const;
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const;

  // Pointer to element [0, 0, ...] (storage base + offset). data<T>() checks T against dtype().
  // Throws for a wrapper (a DTensor): its bytes are only this rank's shard, never the whole
  // tensor its shape describes (read its local shard, or its whole values with item/to_vector).
  void* raw_data() const;
  template <typename T>
  T* data() const;
  // The single element of a one-element tensor, converted to T (f32/bf16/f16/i32/i64 → T).
  template <typename T>
  T item() const;

  // ---- autograd state (the engine in autograd/ gives it meaning) ----
  bool requires_grad() const;
  // Marks a leaf as requiring grad; floating dtypes only. Returns *this for chaining.
  Tensor& set_requires_grad(bool requires_grad);
  // The accumulated gradient of a leaf (undefined until the first backward reaches it).
  Tensor grad() const;
  void set_grad(const Tensor& grad) const;
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  bool is_leaf() const { return grad_fn() == nullptr; }

  // ---- extension (DTensor) ----
  const std::shared_ptr<TensorExtension>& extension() const;

  TensorImpl* impl() const { return impl_.get(); }
  // How many Tensor handles share this one's impl (1: only this handle).
  long handles() const { return impl_.use_count(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  // True when this handle is the only one onto its TensorImpl and no other tensor (view) shares
  // its storage: nothing else can read or write the data (autograd then adopts a gradient
  // instead of copying it).
  bool sole_owner() const;

  // "Tensor(shape=(2, 3), dtype=f32, device=cpu)"; values are printed by to_string() in format.h.
  std::string description() const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

// Opaque state a higher layer attaches to a tensor. `kind()` selects the dispatch handler
// (tensor/dispatch.h) that computes ops on such tensors.
// A wrapper tensor's data on this process (tensor/dispatch.h's extensions: a DTensor's local
// shard) and where it sits in the global tensor the wrapper stands for.
struct LocalPiece {
  Tensor local;
  Shape global_shape;
  Shape global_offset;  // the global index of local's first element along each dim
};

class TensorExtension {
 public:
  virtual ~TensorExtension() = default;
  virtual int kind() const = 0;
  // Whether ops::reshape of such a tensor to `shape` moves no data between the devices or ranks
  // holding it. Autograd formulas ask before choosing a reshaped but equivalent form of a
  // gradient (a DTensor sharded on a dim the reshape merges would have to be gathered first).
  virtual bool reshapes_locally(const Shape& /*shape*/) const { return false; }
  // Whether what the extension holds is seen by nobody else and laid out contiguously, given how
  // many references the wrapper's storage has (Tensor::sole_owner of a wrapper asks it): a
  // result nothing else holds may be adopted rather than copied.
  virtual bool holds_alone(long /*storage_references*/) const { return false; }
  // What an element-wise initializer (ops::normal_, uniform_: each value a function of its
  // global index) fills in place, or nullopt when the data is not a piece of the global tensor
  // (a Partial DTensor's addends).
  virtual std::optional<LocalPiece> local_piece() const { return std::nullopt; }
  // The values of the whole tensor the wrapper stands for, as a plain tensor on this process
  // (a DTensor: redistributed to Replicate, a collective every rank of its mesh must call). What
  // Tensor::item and ops::to_vector read, so they never read a shard as if it were the whole.
  // The default throws: a wrapper that cannot say.
  virtual Tensor whole() const;
  // A gradient of zeros for such a tensor, made without holding its data: what autograd gives
  // an output no gradient reached (an unused slice of unbind). None: plain zeros of its shape.
  virtual std::function<Tensor()> zeros_maker() const { return nullptr; }
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Strides strides;
  int64_t offset = 0;  // in elements
  DType dtype = kFloat32;

  // Autograd state. grad_fn is the node that produced this tensor (null for leaves);
  // output_nr says which of that node's outputs it is.
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<autograd::Node> grad_fn;
  uint32_t output_nr = 0;
  std::shared_ptr<autograd::AutogradMeta> autograd_meta;  // hooks; owned by autograd/

  std::shared_ptr<TensorExtension> extension;
};

// ---- inline accessors ----
inline const Shape& Tensor::shape() const { return impl_->shape; }
inline const Strides& Tensor::strides() const { return impl_->strides; }
inline int64_t Tensor::numel() const { return shape_numel(impl_->shape); }
inline int64_t Tensor::offset() const { return impl_->offset; }
inline DType Tensor::dtype() const { return impl_->dtype; }
inline Device Tensor::device() const { return impl_->storage->device(); }
inline const std::shared_ptr<Storage>& Tensor::storage() const { return impl_->storage; }
inline bool Tensor::sole_owner() const {
  if (impl_ == nullptr || impl_.use_count() != 1) return false;
  if (impl_->extension) {
    return impl_->extension.use_count() == 1 &&
           impl_->extension->holds_alone(impl_->storage.use_count());
  }
  return impl_->storage.use_count() == 1;
}
[[noreturn]] void fail_raw_data_of_wrapper(const Tensor& tensor);
inline void* Tensor::raw_data() const {
  if (impl_->extension) [[unlikely]]
    fail_raw_data_of_wrapper(*this);
  return static_cast<char*>(impl_->storage->data()) + impl_->offset * element_size(impl_->dtype);
}
inline bool Tensor::requires_grad() const { return impl_ && impl_->requires_grad; }
inline Tensor Tensor::grad() const { return impl_->grad; }
inline void Tensor::set_grad(const Tensor& grad) const { impl_->grad = grad; }
inline const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const { return impl_->grad_fn; }
inline const std::shared_ptr<TensorExtension>& Tensor::extension() const {
  return impl_->extension;
}

void check_data_dtype(const Tensor& tensor, DType requested);

template <typename T>
T* Tensor::data() const {
  check_data_dtype(*this, DTypeOf<std::remove_const_t<T>>::value);
  return static_cast<T*>(raw_data());
}

}  // namespace loom
