// A stage whose rank fails mid-step makes its peers fail fast with errors naming the action,
// the peer stage and rank, and the cause — never a hang.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <mutex>

#include "base/error.h"
#include "comm/testing/multi_rank.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/schedules.h"
#include "tensor/ops.h"
#include "tests/parallel/pipeline/pipeline_testing.h"

namespace loom::pipeline {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;
using comm::testing::intercept_failures;

// A layer that throws on its `fail_at`-th forward (counting from 1).
class FailingLayer : public nn::Module {
 public:
  explicit FailingLayer(int fail_at) : Module("FailingLayer"), fail_at_(fail_at) {}
  Tensor forward(const Tensor& x) override {
    if (++calls_ == fail_at_) throw Error("boom: the stage's layer failed");
    return x;
  }

 private:
  int fail_at_;
  int calls_ = 0;
};

TEST(PipelineFaultsTest, PeerThatThrowsBeforeSendingMakesTheOthersFailNamingIt) {
  const Schedule schedule = one_f_one_b_schedule(3, 4);
  std::mutex mutex;
  std::map<int, std::string> caught;
  std::map<int, int64_t> elapsed_ms;
  const auto failures = intercept_failures([&] {
    comm::testing::run_on_ranks(3, [&](comm::ProcessGroup& pg) {
      // Stage 1 fails in its forward of microbatch 1: stage 2 never gets that activation, and
      // stage 0 never gets the gradients it waits for.
      std::shared_ptr<nn::Module> module = testing::build_layers({pg.rank(), pg.rank() + 1});
      if (pg.rank() == 1) module = std::make_shared<FailingLayer>(2);
      auto stage = std::make_shared<PipelineStage>(module, pg.rank(), 3, pg.shared_from_this());
      PipelineExecutor executor(schedule, {stage}, testing::mse_loss);
      const Tensor batch = ops::ones({4, testing::kWidth});
      const auto start = Clock::now();
      try {
        executor.step(pg.rank() == 0 ? batch : Tensor(), pg.rank() == 2 ? batch : Tensor());
      } catch (const Error& e) {
        if (pg.rank() == 1)
          throw;  // the failing rank: run_on_ranks reports it and aborts its group
        std::lock_guard<std::mutex> lock(mutex);
        caught[pg.rank()] = e.what();
        elapsed_ms[pg.rank()] =
            std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
      }
    });
  });
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_THAT(failures[0], HasSubstr("rank 1: pipeline step ('1F1B'): pp rank 1 action 4 F mb 1 "
                                     "stage 1 (from stage 0 on pp rank 0) failed: boom"));
  // Each survivor names its own action, the peer it waited for and the op. (Whether it also
  // names rank 1's error depends on which of its transfers with rank 1 failed first: one that
  // fails after the group was poisoned names the poisoning instead.)
  for (int rank : {0, 2}) {
    SCOPED_TRACE(rank);
    EXPECT_LT(elapsed_ms[rank], 3000) << "must fail fast, not wait out the 10 s timeout";
  }
  // Stage 2 waits for microbatch 1's activation, or for microbatch 0's when rank 1's abort cut
  // that send short while it was in flight.
  EXPECT_THAT(caught[2], HasSubstr("pipeline step ('1F1B'): pp rank 2 action "));
  EXPECT_THAT(caught[2], HasSubstr("stage 2 (from stage 1 on pp rank 1) failed: recv"));
  // Stage 0 has sent its forwards (asynchronously) and waits for microbatch 0's gradient.
  EXPECT_THAT(caught[0], HasSubstr("pipeline step ('1F1B'): pp rank 0 action 7 B mb 0 stage 0 "
                                   "(from stage 1 on pp rank 1) failed: recv"));
}

}  // namespace
}  // namespace loom::pipeline
