#include "comm/collective_call.h"

#include <fmt/format.h>

#include <regex>
#include <sstream>

namespace loom::comm {

std::optional<AllToAllSizes> parse_all_to_all(const std::string& detail) {
  static const std::regex kPattern(R"(^([^,]+), sends \[([0-9, ]*)\], receives \[([0-9, ]*)\]$)");
  std::smatch match;
  if (!std::regex_match(detail, match, kPattern)) return std::nullopt;
  auto numbers = [](const std::string& list) {
    std::vector<int64_t> out;
    std::stringstream items(list);
    for (std::string item; std::getline(items, item, ',');) out.push_back(std::stoll(item));
    return out;
  };
  return AllToAllSizes{match[1].str(), numbers(match[2].str()), numbers(match[3].str())};
}

std::string call_key(CollectiveKind kind, const std::string& detail) {
  if (kind == CollectiveKind::kAllToAll) {
    if (const auto sizes = parse_all_to_all(detail)) {
      return fmt::format("{}({}, sizes by rank)", collective_name(kind), sizes->dtype);
    }
  }
  return fmt::format("{}({})", collective_name(kind), detail);
}

std::string all_to_all_mismatch(const std::vector<AllToAllSizes>& by_group_rank,
                                const std::function<int(int)>& shown) {
  const size_t n = by_group_rank.size();
  for (size_t i = 0; i < n; ++i) {
    const AllToAllSizes& from = by_group_rank[i];
    if (from.sends.size() != n || from.receives.size() != n) {
      return fmt::format("rank {} lists sizes for {} ranks in a group of {}",
                         shown(static_cast<int>(i)), from.sends.size(), n);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      const int64_t sent = by_group_rank[i].sends[j], expected = by_group_rank[j].receives[i];
      if (sent != expected) {
        return fmt::format("rank {} sends rank {} {} elements, and rank {} expects {} from it",
                           shown(static_cast<int>(i)), shown(static_cast<int>(j)), sent,
                           shown(static_cast<int>(j)), expected);
      }
    }
  }
  return "";
}

}  // namespace loom::comm
