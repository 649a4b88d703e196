#include "dtensor/redistribute_plan.h"

#include "base/error.h"

namespace loom {

namespace {

using Kind = RedistributeStep::Kind;

// Whether any mesh dim other than `except` shards `tensor_dim` in `a` or `b`.
bool sharded_elsewhere(const Placements& a, const Placements& b, size_t except,
                       int64_t tensor_dim) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (i == except) continue;
    if (a[i].is_shard(tensor_dim) || b[i].is_shard(tensor_dim)) return true;
  }
  return false;
}

}  // namespace

const char* step_kind_name(Kind kind) {
  switch (kind) {
    case Kind::kAllGather:
      return "all_gather";
    case Kind::kAllReduce:
      return "all_reduce";
    case Kind::kReduceScatter:
      return "reduce_scatter";
    case Kind::kAllToAll:
      return "all_to_all";
    case Kind::kLocalChunk:
      return "local_chunk";
    case Kind::kLocalPartial:
      return "local_partial";
  }
  return "?";
}

std::string RedistributePlan::str() const {
  std::string out = placements_compact(from);
  for (const auto& step : steps) out += " -> " + placements_compact(step.after);
  return out;
}

int64_t RedistributePlan::collective_count() const {
  int64_t n = 0;
  for (const auto& step : steps)
    n += step.kind != Kind::kLocalChunk && step.kind != Kind::kLocalPartial;
  return n;
}

RedistributePlan plan_redistribute(const Placements& from, const Placements& to) {
  LOOM_INTERNAL_ASSERT(from.size() == to.size(), "{} vs {}", placements_str(from),
                       placements_str(to));
  const size_t n = from.size();
  RedistributePlan plan{from, to, {}};

  // 1. Mark changing mesh dims, then inner mesh dims that depend on a marked outer one.
  std::vector<bool> marked(n, false);
  for (size_t i = 0; i < n; ++i) marked[i] = !(from[i] == to[i]);
  for (size_t i = 0; i < n; ++i) {
    if (!marked[i]) continue;
    for (size_t j = i + 1; j < n; ++j) {
      for (const Placement& outer : {from[i], to[i]}) {
        if (outer.is_shard() && (from[j].is_shard(outer.dim()) || to[j].is_shard(outer.dim())))
          marked[j] = true;
      }
    }
  }

  Placements current = from;
  std::vector<bool> done(n, false);
  auto emit = [&](Kind kind, size_t mesh_dim, Placement target) {
    RedistributeStep step{kind, static_cast<int64_t>(mesh_dim), current[mesh_dim], target, {}};
    current[mesh_dim] = target;
    step.after = current;
    plan.steps.push_back(std::move(step));
  };

  // 2. Last to first: down to Replicate, or straight to the target when safe.
  for (size_t k = n; k-- > 0;) {
    if (!marked[k]) continue;
    const Placement src = current[k];
    const Placement dst = to[k];
    if (src == dst && !src.is_shard()) {
      done[k] = true;  // marked only through a dependency it does not have (Partial/Replicate)
      continue;
    }
    if (src.is_shard()) {
      if (dst.is_shard() && dst.dim() != src.dim() &&
          !sharded_elsewhere(current, to, k, src.dim()) &&
          !sharded_elsewhere(current, to, k, dst.dim())) {
        emit(Kind::kAllToAll, k, dst);
        done[k] = true;
      } else {
        emit(Kind::kAllGather, k, Replicate());
      }
    } else if (src.is_partial()) {
      if (dst.is_shard() && !sharded_elsewhere(current, to, k, dst.dim())) {
        emit(Kind::kReduceScatter, k, dst);
        done[k] = true;
      } else {
        emit(Kind::kAllReduce, k, Replicate());
      }
    }
  }
  // 3. First to last: from Replicate up to the target.
  for (size_t k = 0; k < n; ++k) {
    if (!marked[k] || done[k] || current[k] == to[k]) continue;
    LOOM_INTERNAL_ASSERT(current[k].is_replicate(), "mesh dim {} is {} in phase 2", k,
                         current[k].str());
    emit(to[k].is_shard() ? Kind::kLocalChunk : Kind::kLocalPartial, k, to[k]);
  }
  LOOM_INTERNAL_ASSERT(current == to, "plan ends at {} instead of {}", placements_str(current),
                       placements_str(to));
  return plan;
}

}  // namespace loom
