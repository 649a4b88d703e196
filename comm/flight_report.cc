#include "comm/flight_report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <tuple>

#include "base/error.h"
#include "comm/collective_call.h"

namespace loom::comm {

namespace {

RecordState state_of(const std::string& name) {
  if (name == "completed") return RecordState::kCompleted;
  if (name == "failed") return RecordState::kFailed;
  return RecordState::kPending;
}

CollectiveKind kind_of(const std::string& name) {
  for (int k = 0; k < kNumCollectiveKinds; ++k) {
    if (collective_name(static_cast<CollectiveKind>(k)) == name)
      return static_cast<CollectiveKind>(k);
  }
  LOOM_FAIL("flight report: unknown operation '{}'", name);
}

RankDump parse(const nlohmann::json& j) {
  RankDump dump{j.at("rank").get<int>(), j.value("reason", ""), {}};
  for (const auto& g : j.at("groups")) {
    GroupRecords group{g.at("name").get<std::string>(),
                       g.at("rank").get<int>(),
                       g.at("size").get<int>(),
                       g.at("global_ranks").get<std::vector<int>>(),
                       {},
                       g.value("created", int64_t{-1})};
    for (const auto& r : g.at("records")) {
      group.records.push_back(FlightRecord{.sequence = r.at("seq").get<uint64_t>(),
                                           .collective = r.at("collective").get<int64_t>(),
                                           .kind = kind_of(r.at("op").get<std::string>()),
                                           .detail = r.at("detail").get<std::string>(),
                                           .state = state_of(r.at("state").get<std::string>()),
                                           .issued_s = r.at("issued_s").get<double>(),
                                           .ended_s = r.at("ended_s").get<double>(),
                                           .error = r.value("error", "")});
    }
    dump.groups.push_back(std::move(group));
  }
  return dump;
}

std::string op_text(const FlightRecord& r, const std::string& group) {
  return fmt::format("{} #{} ({}) on group '{}'", collective_name(r.kind), r.sequence, r.detail,
                     group);
}

std::string state_text(const FlightRecord& r) {
  if (r.state == RecordState::kFailed) return fmt::format("failed: {}", r.error);
  return std::string(record_state_name(r.state));
}

// "ranks 0, 1 and 3" style lists.
std::string ranks_text(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

// What a rank was doing last: its latest issued operation on any group.
std::string last_operation(const RankDump& dump) {
  const FlightRecord* last = nullptr;
  const std::string* group = nullptr;
  for (const GroupRecords& g : dump.groups) {
    for (const FlightRecord& r : g.records) {
      if (last == nullptr || r.issued_s > last->issued_s) {
        last = &r;
        group = &g.name;
      }
    }
  }
  if (last == nullptr) return "no operation recorded";
  return fmt::format("{}, {}", op_text(*last, *group), state_text(*last));
}

struct Member {
  int global_rank;
  const RankDump* dump;
  const GroupRecords* records;
};

// The first pair of ranks whose all_to_all sizes (collective `index`) disagree, in words; empty
// when every rank sends each peer what that peer expects from it, or some dump lacks the sizes.
std::string all_to_all_mismatch(const std::vector<Member>& members,
                                const std::vector<std::map<int64_t, const FlightRecord*>>& by_index,
                                int64_t index) {
  if (members.empty()) return "";
  const std::vector<int>& globals = members.front().records->global_ranks;
  if (members.size() != globals.size()) return "";  // a rank left no dump: nothing to pair with
  std::vector<AllToAllSizes> by_group_rank(globals.size());
  for (size_t m = 0; m < members.size(); ++m) {
    const auto sizes = parse_all_to_all(by_index[m].at(index)->detail);
    const auto at = std::find(globals.begin(), globals.end(), members[m].global_rank);
    if (!sizes || at == globals.end()) return "";  // an older dump's detail
    by_group_rank[static_cast<size_t>(at - globals.begin())] = *sizes;
  }
  return comm::all_to_all_mismatch(by_group_rank,
                                   [&](int group_rank) { return globals[group_rank]; });
}

std::string report_group(const std::string& name, const std::vector<int>& ranks,
                         const std::vector<Member>& members, const std::set<int>& missing_dumps) {
  const std::string title =
      fmt::format("group '{}' (global ranks {})", name, fmt::join(ranks, ", "));
  // Per member: collective index -> record.
  std::vector<std::map<int64_t, const FlightRecord*>> by_index(members.size());
  int64_t first = 0, last = -1;
  std::vector<int64_t> oldest(members.size(), 0), newest(members.size(), -1);
  for (size_t m = 0; m < members.size(); ++m) {
    for (const FlightRecord& r : members[m].records->records) {
      if (r.collective < 0) continue;
      by_index[m][r.collective] = &r;
    }
    if (!by_index[m].empty()) {
      oldest[m] = by_index[m].begin()->first;
      newest[m] = by_index[m].rbegin()->first;
      first = std::max(first, oldest[m]);  // below it some ring evicted the records
    }
    last = std::max(last, newest[m]);
  }
  std::string missing_note;
  if (!missing_dumps.empty()) {
    std::vector<int> absent(missing_dumps.begin(), missing_dumps.end());
    missing_note = fmt::format(" ({} left no dump)", ranks_text(absent));
  }
  for (int64_t index = first; index <= last; ++index) {
    std::vector<int> entered, absent;
    std::map<std::string, std::vector<int>>
        calls;  // "all_reduce(sum, f32, 1024 elements)" -> ranks
    const FlightRecord* example = nullptr;
    for (size_t m = 0; m < members.size(); ++m) {
      const auto it = by_index[m].find(index);
      if (it == by_index[m].end()) {
        absent.push_back(members[m].global_rank);
        continue;
      }
      entered.push_back(members[m].global_rank);
      if (example == nullptr) example = it->second;
      calls[call_key(it->second->kind, it->second->detail)].push_back(members[m].global_rank);
    }
    if (calls.size() > 1) {
      std::string lines;
      for (const auto& [call, who] : calls)
        lines += fmt::format("\n    {} called {}", ranks_text(who), call);
      return fmt::format(
          "{}: the ranks called different operations as collective {} (the group's #"
          "{} on rank {}):{}{}",
          title, index, example->sequence, entered.front(), lines, missing_note);
    }
    if (!absent.empty()) {
      std::string lines;
      for (size_t m = 0; m < members.size(); ++m) {
        if (by_index[m].contains(index)) continue;
        lines += fmt::format("\n    rank {} did not; its last operation: {}",
                             members[m].global_rank, last_operation(*members[m].dump));
      }
      return fmt::format("{}: first divergence at {}: entered by {}; not by {}{}{}", title,
                         op_text(*example, name), ranks_text(entered), ranks_text(absent), lines,
                         missing_note);
    }
    // Everyone entered it. An all_to_all: does each rank send each peer what the peer expects?
    if (example->kind == CollectiveKind::kAllToAll) {
      if (const std::string mismatch = all_to_all_mismatch(members, by_index, index);
          !mismatch.empty()) {
        return fmt::format("{}: {} on every rank, but {}{}", title, op_text(*example, name),
                           mismatch, missing_note);
      }
    }
    // Did it complete everywhere?
    std::vector<int> unfinished;
    std::string lines;
    for (size_t m = 0; m < members.size(); ++m) {
      const FlightRecord& r = *by_index[m].at(index);
      if (r.state == RecordState::kCompleted) continue;
      unfinished.push_back(members[m].global_rank);
      lines += fmt::format("\n    rank {}: {}", members[m].global_rank, state_text(r));
    }
    if (!unfinished.empty() && !missing_dumps.empty()) {
      // Without their dumps, the ranks that left none may never have entered it.
      std::vector<int> absent_dumps(missing_dumps.begin(), missing_dumps.end());
      return fmt::format(
          "{}: {} did not complete on {} ({} left no dump: they may never have "
          "entered it):{}",
          title, op_text(*example, name), ranks_text(unfinished), ranks_text(absent_dumps), lines);
    }
    if (!unfinished.empty()) {
      return fmt::format("{}: every rank entered {}, but it did not complete on {}:{}{}", title,
                         op_text(*example, name), ranks_text(unfinished), lines, missing_note);
    }
  }
  return fmt::format("{}: consistent, {} collectives recorded on every rank{}", title,
                     last - first + 1, missing_note);
}

}  // namespace

std::vector<RankDump> read_flight_dumps(const std::string& dir,
                                        std::vector<std::string>* unreadable) {
  std::vector<RankDump> dumps;
  std::error_code error;
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string file = entry.path().filename().string();
    if (file.starts_with("rank-") && file.ends_with(".json")) files.push_back(entry.path());
  }
  LOOM_CHECK(!error, "flight report: cannot read the folder '{}': {}", dir, error.message());
  std::sort(files.begin(), files.end());
  for (const auto& path : files) {
    std::ifstream in(path);
    try {
      dumps.push_back(parse(nlohmann::json::parse(in)));
    } catch (const std::exception& e) {
      std::string problem =
          fmt::format("'{}' is not a flight recorder dump: {}", path.string(), e.what());
      if (unreadable == nullptr) LOOM_FAIL("flight report: {}", problem);
      unreadable->push_back(std::move(problem));
    }
  }
  std::sort(dumps.begin(), dumps.end(),
            [](const RankDump& a, const RankDump& b) { return a.rank < b.rank; });
  return dumps;
}

std::string flight_report(const std::vector<RankDump>& dumps, int world_size) {
  std::string out =
      fmt::format("flight recorder: {} rank dump{}", dumps.size(), dumps.size() == 1 ? "" : "s");
  std::set<int> have;
  for (const RankDump& d : dumps) have.insert(d.rank);
  std::vector<int> no_dump;
  for (int r = 0; r < world_size; ++r) {
    if (!have.contains(r)) no_dump.push_back(r);
  }
  if (!no_dump.empty()) out += fmt::format("; none from {}", ranks_text(no_dump));
  out += "\n";
  // Groups by (name, global ranks, which of the rank's groups of that name and ranks), in order
  // of first appearance: two meshes over the same ranks (a MoE job's expert mesh beside the job's)
  // each make a "mesh/pp" of the same ranks, and every rank makes them in the same order.
  using Key = std::tuple<std::string, std::vector<int>, int>;
  std::vector<Key> order;
  std::map<Key, std::vector<Member>> groups;
  for (const RankDump& d : dumps) {
    // A dump lists retired groups before live ones: the order each rank made them pairs copies.
    std::vector<const GroupRecords*> made(d.groups.size());
    for (size_t i = 0; i < d.groups.size(); ++i) made[i] = &d.groups[i];
    std::stable_sort(made.begin(), made.end(), [](const GroupRecords* a, const GroupRecords* b) {
      return a->created < b->created;
    });
    std::map<std::pair<std::string, std::vector<int>>, int> seen;
    for (const GroupRecords* group : made) {
      const GroupRecords& g = *group;
      const Key key{g.name, g.global_ranks, seen[{g.name, g.global_ranks}]++};
      if (!groups.contains(key)) order.push_back(key);
      groups[key].push_back({d.rank, &d, &g});
    }
  }
  for (const auto& key : order) {
    const auto& [name, ranks, occurrence] = key;
    if (ranks.size() < 2) continue;  // one rank cannot diverge from itself
    std::vector<Member>& members = groups[key];
    std::sort(members.begin(), members.end(),
              [](const Member& a, const Member& b) { return a.global_rank < b.global_rank; });
    std::set<int> missing;
    for (int r : ranks) {
      if (!have.contains(r)) missing.insert(r);
    }
    out += report_group(occurrence == 0 ? name : fmt::format("{} (copy {})", name, occurrence + 1),
                        ranks, members, missing) +
           "\n";
  }
  return out;
}

}  // namespace loom::comm
