#include "dtensor/placement.h"

#include <fmt/format.h>

#include "base/error.h"

namespace loom {

Placement Shard(int64_t dim) {
  Placement p;
  p.kind_ = Placement::Kind::kShard;
  p.dim_ = dim;
  return p;
}

Placement Replicate() { return Placement(); }

Placement Partial(comm::ReduceOp op) {
  LOOM_CHECK(op != comm::ReduceOp::kProduct,
             "Partial: reduce op 'product' is not supported (expected sum, avg, max or min)");
  Placement p;
  p.kind_ = Placement::Kind::kPartial;
  p.reduce_op_ = op;
  return p;
}

Placement Placement::normalized(int64_t ndim) const {
  if (!is_shard() || dim_ >= 0) return *this;
  return Shard(dim_ + ndim);
}

std::string Placement::str() const {
  switch (kind_) {
    case Kind::kShard:
      return fmt::format("S({})", dim_);
    case Kind::kReplicate:
      return "R";
    case Kind::kPartial:
      return fmt::format("P({})", comm::reduce_op_name(reduce_op_));
  }
  return "?";
}

size_t Placement::hash() const {
  size_t h = static_cast<size_t>(kind_);
  if (is_shard()) h = h * 1000003u + static_cast<size_t>(dim_ + 1024);
  if (is_partial()) h = h * 1000003u + static_cast<size_t>(reduce_op_);
  return h;
}

std::string placements_str(const Placements& placements) {
  std::string out = "[";
  for (size_t i = 0; i < placements.size(); ++i) {
    if (i) out += ", ";
    out += placements[i].str();
  }
  return out + "]";
}

std::string placements_compact(const Placements& placements) {
  std::string out;
  for (const Placement& p : placements) out += p.str();
  return out;
}

}  // namespace loom
