// DTensor: a Tensor distributed over a DeviceMesh (torch.distributed.tensor.DTensor).
//
// A DTensor *is* a loom::Tensor: its TensorImpl carries the global shape and a
// DTensorExtension holding the spec and this rank's local shard. Ops on it dispatch (via
// tensor/dispatch.h) to sharding propagation (dtensor/sharding/propagator.h), so modules, autograd
// and optimizers take DTensors as they are.
//
// Collective contract: functions that communicate (distribute_tensor, redistribute,
// full_tensor, and ops whose strategy needs a redistribute) must be called by every rank of the
// mesh, in the same order.
#pragma once

#include <memory>
#include <optional>

#include "dtensor/placement.h"
#include "dtensor/spec.h"
#include "mesh/device_mesh.h"
#include "tensor/tensor.h"

namespace loom {

// The TensorExtension kind DTensors carry.
inline constexpr int kDTensorExtensionKind = 1;

class DTensorExtension final : public TensorExtension {
 public:
  DTensorExtension(DTensorSpec spec, Tensor local)
      : spec_(std::move(spec)), local_(std::move(local)) {}
  int kind() const override { return kDTensorExtensionKind; }
  // True when every shard survives the reshape (see dtensor/sharding/views.cc): no redistribute.
  bool reshapes_locally(const Shape& shape) const override;
  // The wrapper and the local shard share one storage: alone when nothing else holds either.
  bool holds_alone(long storage_references) const override {
    return local_.handles() == 1 && local_.is_contiguous() && storage_references == 2;
  }
  // The local shard and its place in the global tensor (none for a Partial DTensor).
  std::optional<LocalPiece> local_piece() const override {
    if (spec_.has_partial()) return std::nullopt;
    return LocalPiece{local_, spec_.shape, spec_.local_offset()};
  }
  // The whole tensor's values on this rank: the local shard redistributed to Replicate
  // (collective over the mesh: every rank calls it, as item() or ops::to_vector of a DTensor).
  Tensor whole() const override;
  // Zeros with this DTensor's spec, each rank its local shape's (no global tensor made).
  std::function<Tensor()> zeros_maker() const override;
  const DTensorSpec& spec() const { return spec_; }
  // The local shard: a plain tensor (never a DTensor), shape spec().local_shape().
  const Tensor& local() const { return local_; }

 private:
  DTensorSpec spec_;
  Tensor local_;
};

bool is_dtensor(const Tensor& tensor);
// Throws naming `op` when `tensor` is not a DTensor.
const DTensorSpec& dtensor_spec(const Tensor& tensor, std::string_view op = "dtensor_spec");
// The local shard without autograd (the raw data). Prefer to_local() in differentiable code.
const Tensor& local_shard(const Tensor& tensor);

// Wraps `local` (a plain tensor, this rank's shard) as a DTensor with `spec`, no communication
// and no autograd recording. Checks local's shape against spec.local_shape().
Tensor make_dtensor(Tensor local, DTensorSpec spec);

// ---- the public API (differentiable where it makes sense) ----

// Every rank passes the full tensor; each keeps its shard. With src_data_rank (default 0) the
// data of the mesh's coordinate-0 rank is broadcast first, so ranks need not agree; with
// std::nullopt no communication happens and every rank must pass the same values. A meta tensor
// (nn/meta_init.h) is never broadcast: it has no values yet. The result is a leaf that requires
// grad when `tensor` does.
Tensor distribute_tensor(const Tensor& tensor, std::shared_ptr<const DeviceMesh> mesh,
                         Placements placements, std::optional<int> src_data_rank = 0);
// This rank's shard as a DTensor with `placements`. `shape` gives the global shape (required
// when shards are uneven; by default it is computed assuming even shards). Differentiable: the
// gradient of the local tensor is the local shard of the DTensor's gradient.
// `run_check` (torch's): at the cost of collectives along each mesh dim, every rank's dtype,
// dims and global shape are checked equal (and without `shape`, the local shapes too: even
// shards), failing on every rank naming the first that differs; then each Replicate mesh dim
// takes its coordinate-0 rank's values (a broadcast into a copy: `local` is not written).
// Without it (the default) nothing is communicated and ranks are trusted to agree.
Tensor from_local(const Tensor& local, std::shared_ptr<const DeviceMesh> mesh,
                  Placements placements, std::optional<Shape> shape = std::nullopt,
                  bool run_check = false);
// The local shard, differentiable (its gradient becomes a DTensor with the same placements,
// Partial treated as Replicate).
Tensor to_local(const Tensor& dtensor);
// Redistributes to `placements` on the same mesh. Differentiable: the backward redistributes
// the gradient back, except that a Partial source's gradient stays Replicate, as torch's does:
// the gradient with respect to the global value, which for Partial(sum) is also each local
// part's own; for avg, max and min it is not scaled or masked to each rank's part.
Tensor redistribute(const Tensor& dtensor, Placements placements);
// The whole tensor on every rank (redistribute to all-Replicate, then to_local).
Tensor full_tensor(const Tensor& dtensor);

}  // namespace loom
