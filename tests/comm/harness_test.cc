// run_on_ranks (comm/testing/multi_rank.h): ranks, failure reporting with the rank named, fast
// failure of the other ranks, the deadline, and ranks stuck outside communication.
#include <gmock/gmock.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include "base/error.h"
#include "comm/testing/multi_rank.h"
#include "tensor/ops.h"

namespace loom::comm {
namespace {

using ::testing::HasSubstr;
using testing::intercept_failures;
using testing::MultiRankOptions;
using testing::run_on_ranks;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST(HarnessTest, EachRankGetsItsOwnGroup) {
  std::mutex mutex;
  std::set<int> ranks;
  MultiRankOptions options;
  options.group_name = "world";
  options.timeout = 3s;
  run_on_ranks(
      3,
      [&](ProcessGroup& pg) {
        EXPECT_EQ(pg.size(), 3);
        EXPECT_EQ(pg.name(), "world");
        EXPECT_EQ(pg.timeout(), 3s);
        EXPECT_EQ(pg.backend_name(), "gloo");
        {
          std::lock_guard<std::mutex> lock(mutex);
          ranks.insert(pg.rank());
        }
        Tensor t = ops::ones({2});
        pg.all_reduce(t)->wait();
        EXPECT_EQ(ops::to_vector(t), (std::vector<double>{3, 3}));
      },
      options);
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
}

TEST(HarnessTest, WorldOfOne) {
  run_on_ranks(1, [](ProcessGroup& pg) {
    Tensor t = ops::full({2}, 7);
    pg.all_reduce(t, ReduceOp::kAvg)->wait();
    pg.barrier()->wait();
    EXPECT_EQ(ops::to_vector(t), (std::vector<double>{7, 7}));
  });
}

// Rank 2 throws; ranks 0 and 1 fail fast in their next collective and their exceptions are
// reported too, after rank 2's (the cause comes first).
TEST(HarnessTest, ExceptionIsReportedWithItsRankAndOthersFailFast) {
  const auto start = Clock::now();
  const auto failures = intercept_failures([] {
    run_on_ranks(3, [](ProcessGroup& pg) {
      pg.barrier()->wait();
      if (pg.rank() == 2) throw Error("boom from the body");
      pg.barrier()->wait();  // never completes: rank 2 is gone
    });                      // default 10 s group timeout
  });
  EXPECT_LT(Clock::now() - start, 5s) << "the other ranks must not wait out the 10 s timeout";
  ASSERT_EQ(failures.size(), 3u);
  EXPECT_THAT(failures[0], HasSubstr("rank 2: boom from the body"));
  for (size_t i = 1; i < 3; ++i) {
    EXPECT_THAT(failures[i], HasSubstr("barrier #1"));
    EXPECT_THAT(failures[i], HasSubstr("ranks [2] did not arrive at this barrier"));
    EXPECT_THAT(failures[i],
                HasSubstr("rank 2 left the group: aborted: rank 2 threw: boom from the body"));
  }
}

TEST(HarnessTest, ExpectFailureInsideARankNamesTheRank) {
  const auto failures = intercept_failures([] {
    run_on_ranks(2, [](ProcessGroup& pg) {
      if (pg.rank() == 1) {
        EXPECT_EQ(pg.rank(), 5) << "deliberate";
      }
    });
  });
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_THAT(failures[0], HasSubstr("deliberate"));
  EXPECT_THAT(failures[0], HasSubstr("rank 1"));
}

TEST(HarnessTest, FatalAssertionAbortsThatRanksGroup) {
  std::string rank0_error;
  const auto failures = intercept_failures([&] {
    run_on_ranks(2, [&](ProcessGroup& pg) {
      pg.barrier()->wait();
      if (pg.rank() == 1) {
        ASSERT_TRUE(false) << "deliberate fatal failure";
      }
      try {
        pg.barrier()->wait();
      } catch (const Error& e) {
        rank0_error = e.what();
      }
    });
  });
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_THAT(failures[0], HasSubstr("deliberate fatal failure"));
  EXPECT_THAT(
      rank0_error,
      HasSubstr("rank 1 left the group: aborted: rank 1 stopped after a fatal test failure"));
}

TEST(HarnessTest, DeadlineNamesTheRanksStillRunning) {
  MultiRankOptions options;
  options.deadline = 300ms;
  options.timeout = 300ms;
  const auto failures = intercept_failures([&] {
    run_on_ranks(
        3,
        [](ProcessGroup& pg) {
          if (pg.rank() == 1) std::this_thread::sleep_for(1s);  // slow, outside communication
        },
        options);
  });
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_THAT(failures[0], HasSubstr("ranks [1] still running after the deadline of 300 ms"));
}

// A rank stuck outside communication forever is detached and reported: the binary goes on.
TEST(HarnessTest, StuckRankIsDetachedInsteadOfHangingTheBinary) {
  struct Gate {
    std::mutex mutex;
    std::condition_variable cv;
    bool open = false;
    std::atomic<bool> exited{false};
  };
  auto gate = std::make_shared<Gate>();
  // Expires when the harness's state for this run is freed: the last thing the detached rank
  // thread does.
  auto sentinel = std::make_shared<int>(0);
  std::weak_ptr<int> run_state_alive = sentinel;
  MultiRankOptions options;
  options.deadline = 200ms;
  options.timeout = 200ms;
  const auto start = Clock::now();
  const auto failures = intercept_failures([&] {
    run_on_ranks(
        2,
        [gate, sentinel](ProcessGroup& pg) {
          if (pg.rank() != 0) return;
          std::unique_lock<std::mutex> lock(gate->mutex);
          gate->cv.wait_for(lock, 30s, [&] { return gate->open; });
          gate->exited = true;
        },
        options);
  });
  sentinel.reset();
  EXPECT_LT(Clock::now() - start, 5s);
  ASSERT_EQ(failures.size(), 2u);
  EXPECT_THAT(failures[0], HasSubstr("ranks [0] still running after the deadline of 200 ms"));
  EXPECT_THAT(failures[1],
              HasSubstr("ranks [0] did not return even after their groups were aborted"));
  // Let the detached rank finish so it does not outlive the test (and the process).
  {
    std::lock_guard<std::mutex> lock(gate->mutex);
    gate->open = true;
  }
  gate->cv.notify_all();
  for (int i = 0; i < 500 && !run_state_alive.expired(); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(gate->exited);
  EXPECT_TRUE(run_state_alive.expired());
  std::this_thread::sleep_for(50ms);  // the thread's last instructions after freeing it
}

}  // namespace
}  // namespace loom::comm
