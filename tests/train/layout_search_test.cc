// loom plan --search on a small model and 4 ranks: every layout once, the job's own rules prune
// what the job would reject (heads over tp, layers over the stages), the memory limit removes
// exactly the layouts whose traced peak exceeds it, and the ranking follows the predicted step
// time.
#include "train/layout_search.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "train/plan_command.h"

namespace loom::train {
namespace {

using ::testing::HasSubstr;

JobConfig small_job() {
  JobConfig job;
  job.model = "tiny";
  job.n_layer = 2;  // pp 4 has more stages than layers
  job.n_head = 2;   // tp 4 does not divide the heads
  job.batch_size = 16;
  job.seq_len = 32;
  return job;
}

LayoutSearchOptions options(int64_t memory_limit = 0) {
  LayoutSearchOptions out{
      .world_size = 4, .memory_limit_bytes = memory_limit, .target = Device::cpu()};
  JobConfig job = small_job();
  job.plan_rank_tflops = 0.05;
  job.plan_link_gbps = 1;
  std::string missing;
  out.machine = plan_machine(job, 4, /*gpu_job=*/false, &missing);
  return out;
}

TEST(LayoutSearchTest, EveryLayoutOnceAndTheJobsRulesPrune) {
  const LayoutSearch search = search_layouts(small_job(), options());
  // tp x pp x dp_shard x dp_replicate = 4 in 10 ways; without a pipeline 2 variants
  // (checkpointing), with one 8 (2 schedules x 2 microbatch counts x 2).
  ASSERT_EQ(search.layouts.size(), 6u * 2 + 3 * 8 + 1 * 8);
  std::set<std::string> seen;
  for (const SearchedLayout& c : search.layouts) {
    EXPECT_TRUE(seen.insert(c.layout).second) << c.layout << " twice";
    const bool rejected = c.job.tp == 4 || c.job.pp == 4;
    EXPECT_EQ(!c.pruned.empty(), rejected) << c.layout << ": " << c.pruned;
    EXPECT_EQ(c.traced, !rejected) << c.layout;
    if (c.job.tp == 4) {
      EXPECT_THAT(c.pruned, HasSubstr("n_head=2 is not divisible by the tp mesh size 4"));
    } else if (c.job.pp == 4) {
      EXPECT_THAT(c.pruned, HasSubstr("the model has 2 layers")) << c.layout;
    }
  }
  // Ranked by the predicted step time, best first; every traced layout is in the ranking.
  ASSERT_EQ(search.ranking.size(),
            static_cast<size_t>(std::count_if(search.layouts.begin(), search.layouts.end(),
                                              [](const SearchedLayout& c) { return c.traced; })));
  for (size_t r = 1; r < search.ranking.size(); ++r) {
    EXPECT_LE(search.layouts[search.ranking[r - 1]].time->step_ms,
              search.layouts[search.ranking[r]].time->step_ms);
  }
}

TEST(LayoutSearchTest, TheMemoryLimitRemovesWhatTheTraceSaysExceedsIt) {
  const LayoutSearch all = search_layouts(small_job(), options());
  std::vector<int64_t> peaks;
  for (const SearchedLayout& c : all.layouts) {
    if (c.traced) peaks.push_back(c.peak_bytes);
  }
  std::sort(peaks.begin(), peaks.end());
  const int64_t limit = peaks[peaks.size() / 2];  // about half fit
  const LayoutSearch limited = search_layouts(small_job(), options(limit));
  size_t within = 0;
  for (const SearchedLayout& c : limited.layouts) {
    if (!c.traced) continue;
    EXPECT_EQ(c.over_limit, c.peak_bytes > limit) << c.layout;
    within += !c.over_limit;
  }
  EXPECT_EQ(limited.ranking.size(), within);
  EXPECT_GT(within, 0u);
  EXPECT_LT(within, peaks.size());
  const std::string text = format_layout_search(limited, options(limit));
  EXPECT_THAT(text, HasSubstr(fmt::format("{} over the memory limit", peaks.size() - within)));
  EXPECT_THAT(text, HasSubstr("The winner's job-file lines:\n\n[parallel]\ntp = "));
}

}  // namespace
}  // namespace loom::train
