#include "optim/clip_grad.h"

#include <algorithm>
#include <cmath>

#include "autograd/grad_mode.h"
#include "base/error.h"
#include "dtensor/dtensor.h"
#include "tensor/ops.h"

namespace loom::optim {

double clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm,
                       const ClipOptions& options) {
  LOOM_CHECK(max_norm > 0, "clip_grad_norm_: max_norm must be positive, got {}", max_norm);
  NoGradGuard no_grad;
  double replicated = 0;
  // Per set of mesh-dim groups a gradient is split over (one for TP or FSDP, two for FSDP on top
  // of TP): the sum of squares of its shards, summed over those groups' ranks. In the order the
  // parameters first name them — the same on every rank, so the all-reduces below are issued in
  // the same order everywhere (a map keyed by address would not be).
  struct ShardedSum {
    std::vector<std::shared_ptr<comm::ProcessGroup>> groups;
    double sum;
  };
  std::vector<ShardedSum> sharded;
  // Each gradient's local tensor (a DTensor's shard) and where its sum of squares adds up: -1
  // the replicated total, else sharded[slot].
  std::vector<Tensor> locals;
  std::vector<int> slots;
  for (const Tensor& p : parameters) {
    const Tensor grad = p.grad();
    if (!grad.defined()) continue;
    const bool counted = std::none_of(options.not_counted.begin(), options.not_counted.end(),
                                      [&](const Tensor& excluded) { return excluded.is_same(p); });
    if (!counted) continue;
    if (!is_dtensor(grad)) {
      locals.push_back(grad);
      slots.push_back(-1);
      continue;
    }
    const DTensorSpec& spec = dtensor_spec(grad);
    std::vector<std::shared_ptr<comm::ProcessGroup>> split;
    for (size_t md = 0; md < spec.placements.size(); ++md) {
      const Placement& placement = spec.placements[md];
      LOOM_CHECK(!placement.is_partial(),
                 "clip_grad_norm_: a gradient is Partial ({}); reduce it first", spec.str());
      if (placement.is_shard()) split.push_back(spec.mesh->group(static_cast<int64_t>(md)));
    }
    locals.push_back(local_shard(grad));
    if (split.empty()) {
      slots.push_back(-1);
      continue;
    }
    auto it = std::find_if(sharded.begin(), sharded.end(),
                           [&](const ShardedSum& e) { return e.groups == split; });
    if (it == sharded.end()) it = sharded.insert(sharded.end(), {std::move(split), 0.0});
    slots.push_back(static_cast<int>(it - sharded.begin()));
  }
  if (!locals.empty()) {
    // Every sum of squares in one pass (on a GPU a few multi-tensor launches, not one or two
    // kernels per parameter) and read back in one copy: one synchronization per call. Added in
    // f64, in parameter order, as each accumulator always was.
    const std::vector<double> values = ops::to_vector(ops::foreach_sum_of_squares(locals));
    for (size_t i = 0; i < values.size(); ++i)
      (slots[i] < 0 ? replicated : sharded[slots[i]].sum) += values[i];
  }
  double total = replicated;
  for (const ShardedSum& entry : sharded) {
    // Summed over each group in turn: over the whole grid of shards they span.
    Tensor sum = ops::full({1}, entry.sum, kFloat32, entry.groups.front()->device());
    for (const auto& group : entry.groups) group->all_reduce(sum)->wait();
    total += sum.item<double>();
  }
  for (const auto& group : options.sum_over) {
    Tensor sum = ops::full({1}, total, kFloat32, group->device());
    group->all_reduce(sum)->wait();
    total = sum.item<double>();
  }
  const double norm = std::sqrt(total);
  // A traced step's gradients are meta, whose norm reads 0: it scales them by 1, so the trace
  // counts the pass a clipping step makes (FlopCounter's in-place bytes) and changes nothing.
  const bool traced = std::any_of(parameters.begin(), parameters.end(), [](const Tensor& p) {
    return p.grad().defined() && p.grad().device().is_meta();
  });
  if (norm > max_norm || traced) {
    const double scale = norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
    // Scaling is linear, so a DTensor's local shard scales alone whatever its placements.
    std::vector<Tensor> grads;
    for (const Tensor& p : parameters) {
      const Tensor grad = p.grad();
      if (grad.defined()) grads.push_back(is_dtensor(grad) ? local_shard(grad) : grad);
    }
    ops::foreach_mul_(grads, scale);
  }
  return norm;
}

}  // namespace loom::optim
