#include "dtensor/redistribute.h"

#include "base/error.h"
#include "dtensor/shard_math.h"
#include "dtensor/transitions/transitions.h"

namespace loom {

namespace {

// Size of `tensor_dim` at `mesh_dim` under `placements`: the chunk the outer mesh dims leave.
int64_t dim_size_at(const DTensorSpec& spec, const Placements& placements, int64_t tensor_dim,
                    int64_t mesh_dim) {
  int64_t size = spec.shape[tensor_dim];
  for (int64_t md = 0; md < mesh_dim; ++md) {
    if (placements[md].is_shard(tensor_dim)) {
      size = shard_range(size, spec.mesh->size(md), spec.mesh->coordinate(md)).size;
    }
  }
  return size;
}

}  // namespace

Tensor redistribute_local(const Tensor& local, const DTensorSpec& spec, const Placements& target) {
  using Kind = RedistributeStep::Kind;
  const RedistributePlan plan = plan_redistribute(spec.placements, target);
  Tensor current = local;
  Placements placements = spec.placements;
  for (const RedistributeStep& step : plan.steps) {
    const int64_t md = step.mesh_dim;
    transitions::MeshDimContext ctx{*spec.mesh->group(md), spec.mesh->coordinate(md),
                                    spec.mesh->size(md), spec.mesh->group_ranks_by_coordinate(md)};
    switch (step.kind) {
      case Kind::kAllGather:
        current = transitions::shard_to_replicate(
            current, ctx, step.from.dim(), dim_size_at(spec, placements, step.from.dim(), md));
        break;
      case Kind::kAllReduce:
        current = transitions::partial_to_replicate(current, ctx, step.from.reduce_op());
        break;
      case Kind::kReduceScatter:
        current = transitions::partial_to_shard(current, ctx, step.from.reduce_op(), step.to.dim(),
                                                dim_size_at(spec, placements, step.to.dim(), md));
        break;
      case Kind::kAllToAll:
        current = transitions::shard_to_shard(
            current, ctx, step.from.dim(), dim_size_at(spec, placements, step.from.dim(), md),
            step.to.dim(), dim_size_at(spec, placements, step.to.dim(), md));
        break;
      case Kind::kLocalChunk:
        current = transitions::replicate_to_shard(current, ctx, step.to.dim(),
                                                  dim_size_at(spec, placements, step.to.dim(), md));
        break;
      case Kind::kLocalPartial:
        current = transitions::replicate_to_partial(current, ctx, step.to.reduce_op());
        break;
    }
    placements = step.after;
  }
  return current;
}

}  // namespace loom
