// run_on_ranks: run a GoogleTest body on several ranks of one process, each with its own real
// ProcessGroupGloo over loopback TCP — the harness every multi-rank test uses.
//
//   #include "comm/testing/multi_rank.h"
//
//   TEST(MyLayer, SumsGradients) {
//     loom::comm::testing::run_on_ranks(4, [](loom::comm::ProcessGroup& pg) {
//       Tensor t = ops::full({3}, pg.rank() + 1.0);
//       pg.all_reduce(t)->wait();
//       EXPECT_EQ(ops::to_vector(t), (std::vector<double>{10, 10, 10}));  // reported as rank N
//     });
//   }
//
// Contract:
//   - `body` runs on world_size threads at once; thread r gets group rank r of a fresh
//     ProcessGroupGloo named options.group_name. The groups share one InMemoryStore, so
//     pg.new_group() works as in a real job.
//   - An exception escaping `body` on rank r is reported by gtest as "rank r: <what()>" (at the
//     run_on_ranks call site), and rank r's group is aborted at once: the other ranks' pending
//     and next operations fail fast (well within options.timeout) with errors naming rank r, so
//     they report too instead of hanging. A failed EXPECT/ASSERT inside `body` is reported by
//     gtest with the trace line "rank r"; a fatal one (ASSERT) also aborts that rank's group.
//   - Exceptions are reported after all ranks returned, in the order they were thrown: the first
//     is usually the cause, the others its consequences.
//   - options.timeout (default 10 s) is every group's operation timeout, so a rank blocked on a
//     peer that never comes fails after it. options.deadline (default 60 s) bounds the whole
//     run: ranks still running then are reported by number, their groups are aborted, and after
//     a further grace period (timeout + 1 s) a rank that still has not returned (stuck outside
//     communication) is detached, reported, and left behind — its body must not use the
//     caller's stack from then on — so a hung rank never hangs the test binary.
//   - Groups made with pg.new_group(ranks, options) take the timeout in those options; pass
//     {.name = ..., .timeout = pg.timeout()} to keep the harness's short timeout.
//   - Each rank's group is destroyed when its body returns (queued operations first run to
//     completion), so a rank that returns early makes peers that still wait on it fail fast.
#pragma once

#include <chrono>
#include <functional>
#include <source_location>
#include <string>
#include <vector>

#include "comm/gloo/process_group_gloo.h"
#include "comm/process_group.h"

namespace loom::comm::testing {

struct MultiRankOptions {
  Duration timeout = std::chrono::seconds(10);   // every group's operation timeout
  Duration deadline = std::chrono::seconds(60);  // for the whole run
  std::string group_name = "default";
  GlooOptions gloo = GlooOptions::loopback();
};

void run_on_ranks(int world_size, const std::function<void(ProcessGroup& pg)>& body,
                  MultiRankOptions options = {},
                  std::source_location location = std::source_location::current());

// Runs `body` with every gtest failure, from any thread, intercepted instead of reported, and
// returns their messages in order: how a test of a failure path asserts on what run_on_ranks
// reported ("rank 1: boom").
std::vector<std::string> intercept_failures(const std::function<void()>& body);

}  // namespace loom::comm::testing
