// How one collective's calls on different ranks are compared, by the flight report
// (comm/flight_report.h) and by LOOM_DEBUG=collectives (comm/process_group.h) alike: the same
// kind and detail ("sum, f32, 1024 elements") on every rank, except an all_to_all, whose sizes
// differ by rank by design (a mixture of experts' dispatch): its ranks agree on the dtype, and
// each sends each peer what that peer expects from it.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "comm/types.h"

namespace loom::comm {

// An all_to_all's detail, "f32, sends [a, b], receives [c, d]" (ProcessGroup::all_to_all's):
// the dtype, and the elements it sends to and expects from each group rank.
struct AllToAllSizes {
  std::string dtype;
  std::vector<int64_t> sends, receives;
};
std::optional<AllToAllSizes> parse_all_to_all(const std::string& detail);

// What must be the same on every rank: "kind(detail)", with an all_to_all's sizes left out.
std::string call_key(CollectiveKind kind, const std::string& detail);

// The first pair of ranks whose all_to_all sizes disagree, in words ("rank 0 sends rank 1 768
// elements, and rank 1 expects 700 from it"), naming each group rank r as `shown(r)` (its global
// rank, say); empty when every rank sends each peer what it expects. `by_group_rank[r]` is group
// rank r's sizes.
std::string all_to_all_mismatch(const std::vector<AllToAllSizes>& by_group_rank,
                                const std::function<int(int)>& shown);

}  // namespace loom::comm
