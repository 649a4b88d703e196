// The redistribute planner: which per-mesh-dim transitions turn one placement list into
// another, in a correct order. Pure: no communication, so it is tested exhaustively alone.
//
//   plan_redistribute({S(0), R}, {R, S(1)})  prints  "S(0)R -> RR -> RS(1)"
//
// Order. A tensor dim sharded by several mesh dims is split in mesh-dim order, so an inner
// (higher) mesh dim's shard depends on the outer ones. The planner therefore:
//   1. marks every mesh dim whose placement changes, plus every mesh dim that shards a tensor
//      dim that an earlier marked mesh dim shards (before or after);
//   2. walks marked mesh dims from last to first, taking each to Replicate (S->R all-gather,
//      P->R all-reduce) — or straight to its target when that is safe (P->S reduce-scatter,
//      S(a)->S(b) all-to-all: no other mesh dim shards the dims involved);
//   3. walks them first to last from Replicate to the target (R->S local chunk, R->P local).
#pragma once

#include <string>
#include <vector>

#include "dtensor/placement.h"

namespace loom {

struct RedistributeStep {
  enum class Kind {
    kAllGather,      // S(d) -> R
    kAllReduce,      // P -> R
    kReduceScatter,  // P -> S(d)
    kAllToAll,       // S(a) -> S(b)
    kLocalChunk,     // R -> S(d), no communication
    kLocalPartial,   // R -> P, no communication
  };
  Kind kind;
  int64_t mesh_dim;
  Placement from;
  Placement to;
  Placements after;  // all placements once this step has run
};

struct RedistributePlan {
  Placements from;
  Placements to;
  std::vector<RedistributeStep> steps;
  // "S(0)R -> RR -> RS(1)"; just "S(0)R" for an empty plan.
  std::string str() const;
  // Steps that communicate.
  int64_t collective_count() const;
};

// Placements must already be normalized (non-negative Shard dims), one per mesh dim.
RedistributePlan plan_redistribute(const Placements& from, const Placements& to);

const char* step_kind_name(RedistributeStep::Kind kind);

}  // namespace loom
