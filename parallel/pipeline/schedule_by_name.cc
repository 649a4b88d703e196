#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "base/error.h"
#include "parallel/pipeline/schedules.h"

namespace loom::pipeline {

namespace {
bool is_v(const std::string& name) { return name == "zbv" || name == "dualpipev"; }
}  // namespace

int stages_per_rank_of(const std::string& name, int virtual_stages) {
  return is_v(name) ? 2 : virtual_stages;  // the others: as given (schedule_by_name checks it)
}

StagePlacement placement_of(const std::string& name) {
  return is_v(name) ? StagePlacement::kV : StagePlacement::kLoop;
}

namespace {

Schedule build_schedule(const std::string& name, int num_ranks, int num_microbatches,
                        int stages_per_rank) {
  if (name == "interleaved")
    return interleaved_one_f_one_b_schedule(num_ranks, num_microbatches, stages_per_rank);
  if (is_v(name)) {
    LOOM_CHECK(stages_per_rank == 1 || stages_per_rank == 2,
               "pipeline: {} places two stages per rank in a V; got {} virtual stages per rank "
               "(leave it unset, or 2)",
               name, stages_per_rank);
    return name == "zbv" ? zbv_schedule(num_ranks, num_microbatches)
                         : dualpipev_schedule(num_ranks, num_microbatches);
  }
  LOOM_CHECK(name == "gpipe" || name == "1f1b" || name == "zb-h1",
             "pipeline: unknown schedule '{}' (expected gpipe, 1f1b, zb-h1, interleaved, zbv or "
             "dualpipev)",
             name);
  LOOM_CHECK(stages_per_rank == 1,
             "pipeline: {} places one stage per rank; {} virtual stages per rank need --schedule "
             "interleaved",
             name, stages_per_rank);
  if (name == "zb-h1") return zb_h1_schedule(num_ranks, num_microbatches);
  return name == "gpipe" ? gpipe_schedule(num_ranks, num_microbatches)
                         : one_f_one_b_schedule(num_ranks, num_microbatches);
}

}  // namespace

// A schedule is a pure function of its name and sizes, and a job builds the same one several
// times (its checks, the plan, the executor; `loom plan --search` once per layout): the recent
// ones are kept. Failures are not kept (they throw before building anything).
Schedule schedule_by_name(const std::string& name, int num_ranks, int num_microbatches,
                          int stages_per_rank) {
  using Key = std::tuple<std::string, int, int, int>;
  static std::mutex mutex;
  static std::map<Key, std::shared_ptr<const Schedule>> recent;
  static std::deque<Key> order;  // oldest first
  constexpr size_t kKept = 64;
  const Key key{name, num_ranks, num_microbatches, stages_per_rank};
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (const auto it = recent.find(key); it != recent.end()) return *it->second;
  }
  auto built = std::make_shared<const Schedule>(
      build_schedule(name, num_ranks, num_microbatches, stages_per_rank));
  std::lock_guard<std::mutex> lock(mutex);
  if (recent.emplace(key, built).second) {
    order.push_back(key);
    if (order.size() > kKept) {
      recent.erase(order.front());
      order.pop_front();
    }
  }
  return *built;
}

}  // namespace loom::pipeline
