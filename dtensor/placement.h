// How one mesh dimension holds a DTensor: Shard(tensor_dim), Replicate(), Partial(reduce op).
//
// Placements are plain values — equality, hashing, short printing (S(0), R, P(sum)) — and
// never run collectives themselves; redistribute (dtensor/redistribute.h) does.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/types.h"

namespace loom {

class Placement {
 public:
  enum class Kind : uint8_t { kShard, kReplicate, kPartial };

  // Default: Replicate.
  Placement() = default;

  Kind kind() const { return kind_; }
  bool is_shard() const { return kind_ == Kind::kShard; }
  bool is_shard(int64_t tensor_dim) const { return is_shard() && dim_ == tensor_dim; }
  bool is_replicate() const { return kind_ == Kind::kReplicate; }
  bool is_partial() const { return kind_ == Kind::kPartial; }
  // The sharded tensor dim (Shard only; may be negative until normalized against a rank).
  int64_t dim() const { return dim_; }
  // The pending reduction (Partial only).
  comm::ReduceOp reduce_op() const { return reduce_op_; }

  // Shard with a negative dim mapped into [0, ndim); other placements unchanged.
  Placement normalized(int64_t ndim) const;

  // "S(0)", "R", "P(sum)".
  std::string str() const;
  bool operator==(const Placement& other) const {
    return kind_ == other.kind_ && (!is_shard() || dim_ == other.dim_) &&
           (!is_partial() || reduce_op_ == other.reduce_op_);
  }
  size_t hash() const;

 private:
  friend Placement Shard(int64_t dim);
  friend Placement Replicate();
  friend Placement Partial(comm::ReduceOp op);
  Kind kind_ = Kind::kReplicate;
  int64_t dim_ = 0;
  comm::ReduceOp reduce_op_ = comm::ReduceOp::kSum;
};

// Tensor dim `dim` is split across the mesh dim (chunks of ceil(n / k), trailing ones smaller or
// empty, as torch.chunk).
Placement Shard(int64_t dim);
// Every rank of the mesh dim holds the whole tensor.
Placement Replicate();
// Every rank holds a partial value; the logical tensor is their reduction by `op`
// (sum, avg, max, min).
Placement Partial(comm::ReduceOp op = comm::ReduceOp::kSum);

using Placements = std::vector<Placement>;

// "[S(0), R]"
std::string placements_str(const Placements& placements);
// "S(0)R" — the compact form redistribute plans print.
std::string placements_compact(const Placements& placements);

}  // namespace loom

template <>
struct std::hash<loom::Placement> {
  size_t operator()(const loom::Placement& p) const { return p.hash(); }
};
