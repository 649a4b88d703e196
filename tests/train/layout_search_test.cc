// loom plan --search on a small model and 4 ranks: every layout once, the job's own rules prune
// what the job would reject (heads over tp, layers over the stages), the memory limit removes
// exactly the layouts whose traced peak exceeds it, and the ranking follows the predicted step
// time. Traces run several at once and kept in the trace cache give the same figures as one at a
// time and anew.
#include "train/layout_search.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
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

// Every layout traced (no bound) unless `bound`.
LayoutSearchOptions options(int64_t memory_limit = 0, bool bound = false) {
  LayoutSearchOptions out{
      .world_size = 4, .memory_limit_bytes = memory_limit, .target = Device::cpu(), .bound = bound};
  JobConfig job = small_job();
  job.plan_rank_tflops = 0.05;
  job.plan_link_gbps = 1;
  std::string missing;
  out.machine = plan_machine(job, 4, /*gpu_job=*/false, &missing);
  return out;
}

TEST(LayoutSearchTest, EveryLayoutOnceAndTheJobsRulesPrune) {
  const LayoutSearch search = search_layouts(small_job(), options());
  // tp x pp x dp_shard x dp_replicate = 4 in 10 ways; 3 checkpointing modes each; with a
  // pipeline 9 schedules (1F1B, ZB-H1, interleaved and ZBV at 2 microbatch counts, DualPipeV).
  ASSERT_EQ(search.layouts.size(), 6u * 3 + 3 * 9 * 3 + 1 * 9 * 3);
  std::set<std::string> seen;
  for (const SearchedLayout& c : search.layouts) {
    EXPECT_TRUE(seen.insert(c.layout).second) << c.layout << " twice";
    // Two stages per rank (interleaved, the V's) on pp 2 are 4 stages for 2 layers.
    const bool two_stages =
        c.job.schedule == "interleaved" || c.job.schedule == "zbv" || c.job.schedule == "dualpipev";
    const bool rejected = c.job.tp == 4 || c.job.pp == 4 || (c.job.pp == 2 && two_stages);
    EXPECT_EQ(!c.pruned.empty(), rejected) << c.layout << ": " << c.pruned;
    EXPECT_EQ(c.traced, !rejected) << c.layout;
    if (c.job.tp == 4) {
      EXPECT_THAT(c.pruned, HasSubstr("n_head=2 is not divisible by the tp mesh size 4"));
    } else if (rejected) {
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

// The job's grad_accum (and its cp without --search-cp) are part of its step: every candidate
// keeps them, where the search had traced each layout at grad_accum 1 and cp 1 (peaks of another
// job, and layouts the job then refused).
TEST(LayoutSearchTest, CandidatesKeepTheJobsAccumulationAndContextParallelism) {
  JobConfig job = small_job();
  job.grad_accum = 4;
  job.cp = 2;
  const std::vector<SearchedLayout> layouts = enumerate_layouts(job, 4, LayoutSpace{});
  ASSERT_FALSE(layouts.empty());
  for (const SearchedLayout& c : layouts) {
    EXPECT_EQ(c.job.grad_accum, 4) << c.layout;
    EXPECT_EQ(c.job.cp, 2) << c.layout;
    EXPECT_EQ(c.job.tp * c.job.pp * c.job.cp * c.job.dp_shard * c.job.dp_replicate, 4) << c.layout;
  }
  // With --search-cp, cp is searched over the divisors instead.
  std::set<int64_t> cps;
  for (const SearchedLayout& c : enumerate_layouts(job, 4, LayoutSpace{.cp = true})) {
    cps.insert(c.job.cp);
  }
  EXPECT_EQ(cps, (std::set<int64_t>{1, 2, 4}));
  // A pipeline whose microbatches the accumulated batch does not split is pruned with the job's
  // own message: 16 sequences over dp 2 and grad_accum 4 are 2 per step, not 4 microbatches.
  job.cp = 1;
  const LayoutSearch search = search_layouts(job, options());
  bool found = false;
  for (const SearchedLayout& c : search.layouts) {
    // (Schedules of 2 stages per rank are pruned first: 4 stages for 2 layers.)
    const bool one_stage_per_rank = c.job.schedule == "1f1b" || c.job.schedule == "zb-h1";
    if (c.job.pp == 2 && c.job.dp_replicate == 2 && c.job.microbatches == 4 && one_stage_per_rank) {
      found = true;
      EXPECT_THAT(c.pruned, HasSubstr("over grad_accum 4 do not split into 4 microbatches"))
          << c.layout;
    }
  }
  EXPECT_TRUE(found);
}

TEST(LayoutSearchTest, TheBoundSkipsOnlyLayoutsThatCannotWin) {
  const LayoutSearch all = search_layouts(small_job(), options());
  const LayoutSearch bounded = search_layouts(small_job(), options(0, /*bound=*/true));
  ASSERT_EQ(all.layouts.size(), bounded.layouts.size());
  ASSERT_FALSE(bounded.ranking.empty());
  // The same winner, at the same predicted time.
  const SearchedLayout& winner = bounded.layouts[bounded.ranking.front()];
  EXPECT_EQ(winner.layout, all.layouts[all.ranking.front()].layout);
  EXPECT_EQ(winner.time->step_ms, all.layouts[all.ranking.front()].time->step_ms);
  int skipped = 0;
  for (size_t i = 0; i < all.layouts.size(); ++i) {
    const SearchedLayout &b = bounded.layouts[i], &a = all.layouts[i];
    if (!a.traced) continue;
    // Every bound is below (or at) the layout's predicted step: it is a lower bound.
    if (b.lower_bound_ms > 0) {
      EXPECT_LE(b.lower_bound_ms, a.time->step_ms) << a.layout;
    }
    if (b.traced) {
      EXPECT_EQ(b.time->step_ms, a.time->step_ms) << a.layout;
      continue;
    }
    // Skipped: its bound is at least the winner's step, so it could not have won.
    ++skipped;
    EXPECT_GE(b.lower_bound_ms, winner.time->step_ms) << a.layout;
    EXPECT_GE(a.time->step_ms, winner.time->step_ms) << a.layout;
    EXPECT_THAT(b.not_traced, HasSubstr("cannot beat the best")) << a.layout;
  }
  EXPECT_GT(skipped, 0);  // on this model the bubble's bound rules some pipelines out
  EXPECT_THAT(format_layout_search(bounded, options(0, true)),
              HasSubstr(fmt::format("{} that could not beat the best", skipped)));
}

TEST(LayoutSearchTest, ModelStatesOverTheLimitAreDroppedUntraced) {
  const LayoutSearch all = search_layouts(small_job(), options());
  std::vector<int64_t> states;
  for (const SearchedLayout& c : all.layouts) {
    if (!c.traced) continue;
    EXPECT_GT(c.model_state_bytes, 0) << c.layout;
    // The states are a lower bound of the traced peak (parameters, gradients and the moments
    // are all alive at the optimizer step).
    EXPECT_GE(c.peak_bytes, c.model_state_bytes) << c.layout;
    states.push_back(c.model_state_bytes);
  }
  std::sort(states.begin(), states.end());
  const int64_t limit = states.back() - 1;  // the most replicated layouts' states exceed it
  const LayoutSearch limited = search_layouts(small_job(), options(limit));
  int dropped = 0;
  for (const SearchedLayout& c : limited.layouts) {
    if (!c.pruned.empty()) continue;
    const bool states_over = c.model_state_bytes > limit;
    EXPECT_EQ(c.traced, !states_over) << c.layout;
    if (states_over) {
      ++dropped;
      EXPECT_TRUE(c.over_limit) << c.layout;
      EXPECT_THAT(c.not_traced, HasSubstr("its model states alone")) << c.layout;
    }
  }
  EXPECT_GT(dropped, 0);
  EXPECT_THAT(format_layout_search(limited, options(limit)),
              HasSubstr(fmt::format("({} by their model states alone, not traced)", dropped)));
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
  // The layouts over the limit that the unlimited search ranks above the limited winner are
  // named as lost on memory.
  const double winner_ms = limited.layouts[limited.ranking.front()].time->step_ms;
  size_t faster_over = 0;
  for (const SearchedLayout& c : limited.layouts) {
    faster_over += c.traced && c.over_limit && c.time->step_ms < winner_ms;
  }
  EXPECT_GT(faster_over, 0u);  // at the median peak, faster layouts do not fit
  EXPECT_THAT(text,
              HasSubstr(fmt::format("Faster, over the memory limit ({} in all):", faster_over)));
  EXPECT_THAT(text, HasSubstr("lost on memory ("));
}

// Every figure the search ranks by, per layout.
void expect_same_figures(const LayoutSearch& a, const LayoutSearch& b) {
  ASSERT_EQ(a.layouts.size(), b.layouts.size());
  for (size_t i = 0; i < a.layouts.size(); ++i) {
    const SearchedLayout &x = a.layouts[i], &y = b.layouts[i];
    EXPECT_EQ(x.layout, y.layout);
    EXPECT_EQ(x.pruned, y.pruned) << x.layout;
    EXPECT_EQ(x.traced, y.traced) << x.layout;
    EXPECT_EQ(x.peak_bytes, y.peak_bytes) << x.layout;
    ASSERT_EQ(x.time.has_value(), y.time.has_value()) << x.layout;
    if (x.time) {
      EXPECT_EQ(x.time->step_ms, y.time->step_ms) << x.layout;  // the same trace: bitwise
      EXPECT_EQ(x.time->exposed_comm_ms, y.time->exposed_comm_ms) << x.layout;
    }
  }
  EXPECT_EQ(a.ranking, b.ranking);
}

TEST(LayoutSearchTest, TracesAtOnceGiveTheFiguresOfOneAtATime) {
  LayoutSearchOptions serial = options();
  serial.jobs = 1;
  LayoutSearchOptions parallel = options();
  parallel.jobs = 3;
  const LayoutSearch one = search_layouts(small_job(), serial);
  const LayoutSearch three = search_layouts(small_job(), parallel);
  EXPECT_EQ(one.jobs, 1);
  EXPECT_EQ(three.jobs, 3);
  expect_same_figures(one, three);
}

TEST(LayoutSearchTest, TheCacheGivesBackWhatWasTracedAndRetracesATornEntry) {
  const std::string dir = ::testing::TempDir() + "/trace_cache";
  std::filesystem::remove_all(dir);
  TraceCache cache(dir);
  LayoutSearchOptions cached = options();
  cached.cache = &cache;
  const LayoutSearch first = search_layouts(small_job(), cached);
  size_t traced = 0;
  for (const SearchedLayout& c : first.layouts) {
    EXPECT_FALSE(c.from_cache) << c.layout;
    traced += c.traced;
  }
  std::vector<std::filesystem::path> entries;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) entries.push_back(entry);
  ASSERT_EQ(entries.size(), traced);  // one entry per traced layout
  EXPECT_EQ(first.cache_dir, dir);
  EXPECT_EQ(first.cache_write_error, "");

  // Again: every trace read back, the same figures.
  const LayoutSearch second = search_layouts(small_job(), cached);
  for (const SearchedLayout& c : second.layouts) {
    EXPECT_EQ(c.from_cache, c.traced) << c.layout;
    EXPECT_EQ(c.trace_s, 0) << c.layout;
  }
  expect_same_figures(first, second);
  EXPECT_THAT(format_layout_search(second, cached),
              HasSubstr(fmt::format("0 traced, {} read back from the trace cache", traced)));

  // A torn entry is traced again (and rewritten); the figures do not change.
  std::ofstream(entries.front(), std::ios::trunc) << "{\"format\": 1, \"traced\": [{\"rank";
  const LayoutSearch third = search_layouts(small_job(), cached);
  EXPECT_EQ(std::count_if(third.layouts.begin(), third.layouts.end(),
                          [](const SearchedLayout& c) { return c.traced && !c.from_cache; }),
            1);
  expect_same_figures(first, third);

  // Another model is another key: nothing read back.
  JobConfig wider = small_job();
  wider.n_embd = 96;  // tiny has 64
  const LayoutSearch other = search_layouts(wider, cached);
  for (const SearchedLayout& c : other.layouts) EXPECT_FALSE(c.from_cache) << c.layout;
}

}  // namespace
}  // namespace loom::train
