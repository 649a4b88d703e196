#include "tests/testing/collectives.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <vector>

namespace loom::testing {

std::string collectives_str(const Collectives& c) {
  std::vector<std::string> parts;
  const std::pair<int64_t, const char*> kinds[] = {{c.all_reduce, "all_reduce"},
                                                   {c.all_gather, "all_gather"},
                                                   {c.reduce_scatter, "reduce_scatter"},
                                                   {c.all_to_all, "all_to_all"}};
  for (const auto& [n, name] : kinds) {
    if (n != 0) parts.push_back(fmt::format("{} {}", n, name));
  }
  return parts.empty() ? "none" : fmt::format("{}", fmt::join(parts, ", "));
}

void expect_collectives(const CommDebugMode& comm, const Collectives& expected,
                        const std::string& what, std::source_location where) {
  using comm::CollectiveKind;
  const Collectives seen{.all_reduce = comm.count(CollectiveKind::kAllReduce),
                         .all_gather = comm.count(CollectiveKind::kAllGather),
                         .reduce_scatter = comm.count(CollectiveKind::kReduceScatter),
                         .all_to_all = comm.count(CollectiveKind::kAllToAll)};
  if (seen == expected && comm.total_count() == expected.total()) return;
  ADD_FAILURE_AT(where.file_name(), static_cast<int>(where.line()))
      << what << ": expected " << collectives_str(expected) << ", issued " << comm.summary();
}

}  // namespace loom::testing
