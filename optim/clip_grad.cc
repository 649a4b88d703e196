#include "optim/clip_grad.h"

#include <algorithm>
#include <cmath>

#include "autograd/grad_mode.h"
#include "base/error.h"
#include "dtensor/dtensor.h"
#include "tensor/ops.h"

namespace loom::optim {

namespace {

// One gradient's sum of squares as a (1,) f32 tensor where the gradient lives: read back with
// the others in one copy (on a GPU one synchronization per call, not one per parameter).
Tensor local_square_sum(const Tensor& t) {
  const Tensor local = ops::to(t, kFloat32);
  return ops::reshape(ops::sum(ops::mul(local, local)), {1});
}

}  // namespace

double clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm,
                       const ClipOptions& options) {
  LOOM_CHECK(max_norm > 0, "clip_grad_norm_: max_norm must be positive, got {}", max_norm);
  NoGradGuard no_grad;
  double replicated = 0;
  // Per (mesh, mesh dim): the sum of squares of shards split across that mesh dim's ranks, in the
  // order the parameters first name them — the same on every rank, so the all-reduces below are
  // issued in the same order everywhere (a map keyed by address would not be).
  struct ShardedSum {
    const DeviceMesh* mesh;
    int64_t mesh_dim;
    std::shared_ptr<const DeviceMesh> owner;
    double sum;
  };
  std::vector<ShardedSum> sharded;
  // Each gradient's sum and where it adds up: -1 the replicated total, else sharded[slot].
  std::vector<Tensor> sums;
  std::vector<int> slots;
  for (const Tensor& p : parameters) {
    const Tensor grad = p.grad();
    if (!grad.defined()) continue;
    const bool counted = std::none_of(options.not_counted.begin(), options.not_counted.end(),
                                      [&](const Tensor& excluded) { return excluded.is_same(p); });
    if (!counted) continue;
    if (!is_dtensor(grad)) {
      sums.push_back(local_square_sum(grad));
      slots.push_back(-1);
      continue;
    }
    const DTensorSpec& spec = dtensor_spec(grad);
    int64_t split_dim = -1;
    for (size_t md = 0; md < spec.placements.size(); ++md) {
      const Placement& placement = spec.placements[md];
      LOOM_CHECK(!placement.is_partial(),
                 "clip_grad_norm_: a gradient is Partial ({}); reduce it first", spec.str());
      if (!placement.is_shard()) continue;
      LOOM_CHECK(
          split_dim < 0,
          "clip_grad_norm_: gradients sharded over several mesh dims are not supported yet ({})",
          spec.str());
      split_dim = static_cast<int64_t>(md);
    }
    if (split_dim >= 0) {
      auto it = std::find_if(sharded.begin(), sharded.end(), [&](const ShardedSum& e) {
        return e.mesh == spec.mesh.get() && e.mesh_dim == split_dim;
      });
      if (it == sharded.end())
        it = sharded.insert(sharded.end(), {spec.mesh.get(), split_dim, spec.mesh, 0.0});
      sums.push_back(local_square_sum(local_shard(grad)));
      slots.push_back(static_cast<int>(it - sharded.begin()));
    } else {
      sums.push_back(local_square_sum(local_shard(grad)));
      slots.push_back(-1);
    }
  }
  if (!sums.empty()) {
    // Added in f64, in parameter order, as each accumulator always was.
    const std::vector<double> values = ops::to_vector(ops::cat(sums, 0));
    for (size_t i = 0; i < values.size(); ++i)
      (slots[i] < 0 ? replicated : sharded[slots[i]].sum) += values[i];
  }
  double total = replicated;
  for (const ShardedSum& entry : sharded) {
    const auto& group = entry.owner->group(entry.mesh_dim);
    Tensor sum = ops::full({1}, entry.sum, kFloat32, group->device());
    group->all_reduce(sum)->wait();
    total += sum.item<double>();
  }
  for (const auto& group : options.sum_over) {
    Tensor sum = ops::full({1}, total, kFloat32, group->device());
    group->all_reduce(sum)->wait();
    total = sum.item<double>();
  }
  const double norm = std::sqrt(total);
  if (norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);
    for (const Tensor& p : parameters) {
      const Tensor grad = p.grad();
      if (grad.defined()) ops::copy_(grad, ops::mul(grad, scale));
    }
  }
  return norm;
}

}  // namespace loom::optim
