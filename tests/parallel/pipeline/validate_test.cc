// validate_schedule on broken schedules: each error names the rule, the rank, the action's
// position and the action. The valid base is a hand-written 1F1B for 2 ranks, 2 microbatches.
#include "parallel/pipeline/validate.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"

namespace loom::pipeline {
namespace {

using ::testing::HasSubstr;

const std::string kRank0 = "F0s0 SEND_F0s0 F1s0 SEND_F1s0 RECV_B0s0 B0s0 RECV_B1s0 B1s0";
const std::string kRank1 = "RECV_F0s1 F0s1 B0s1 SEND_B0s1 RECV_F1s1 F1s1 B1s1 SEND_B1s1";

Schedule two_ranks(const std::string& rank0, const std::string& rank1) {
  return Schedule::from_text(2, 2, 2, {rank0, rank1});
}

// The message validate_schedule throws (fails the test if it does not throw).
std::string error_of(const Schedule& schedule, ValidateOptions options = {}) {
  try {
    validate_schedule(schedule, options);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected validate_schedule to throw for\n" << schedule.str();
  return "";
}

TEST(ValidateTest, TheBaseScheduleIsValid) {
  EXPECT_NO_THROW(validate_schedule(two_ranks(kRank0, kRank1)));
}

TEST(ValidateTest, MissingSend) {
  EXPECT_EQ(error_of(two_ranks("F0s0 SEND_F0s0 F1s0 RECV_B0s0 B0s0 RECV_B1s0 B1s0", kRank1)),
            "schedule: rank 1 action 4 RECV_F mb 1 stage 1 has no matching SEND_F on rank 0 "
            "(SEND_F mb 1 stage 0)");
}

TEST(ValidateTest, SendWithoutReceive) {
  EXPECT_EQ(error_of(two_ranks(kRank0, "RECV_F0s1 F0s1 B0s1 SEND_B0s1 F1s1 B1s1 SEND_B1s1")),
            "schedule: rank 0 action 3 SEND_F mb 1 stage 0 has no matching RECV_F on rank 1 "
            "(RECV_F mb 1 stage 1)");
}

TEST(ValidateTest, DuplicateReceive) {
  EXPECT_EQ(error_of(two_ranks(kRank0, "RECV_F0s1 " + kRank1)),
            "schedule: rank 1 action 1 RECV_F mb 0 stage 1 repeats action 0");
}

TEST(ValidateTest, ReceivesInAnotherOrderThanTheSendsAreRejected) {
  // Every message has its match, but rank 1 posts microbatch 1's receive first: without tags (as
  // on NCCL) it would pair with microbatch 0's activation.
  EXPECT_EQ(
      error_of(two_ranks(kRank0, "RECV_F1s1 RECV_F0s1 F0s1 B0s1 SEND_B0s1 F1s1 B1s1 SEND_B1s1")),
      "schedule: rank 1 action 0 RECV_F mb 1 stage 1 is rank 1's receive #0 from rank 0, but rank "
      "0's send #0 "
      "to rank 1 is action 1 SEND_F mb 0 stage 0; messages between two ranks pair up in the order "
      "they are "
      "issued (no tags, as on NCCL), so both ranks must list them in the same order");
}

TEST(ValidateTest, BackwardBeforeForward) {
  EXPECT_EQ(
      error_of(two_ranks(kRank0, "RECV_F0s1 B0s1 F0s1 SEND_B0s1 RECV_F1s1 F1s1 B1s1 SEND_B1s1")),
      "schedule: rank 1 action 1 B mb 0 stage 1 runs before F mb 0 stage 1 (action 2), its "
      "forward");
}

TEST(ValidateTest, ForwardBeforeItsInputArrives) {
  EXPECT_EQ(
      error_of(two_ranks(kRank0, "F0s1 RECV_F0s1 B0s1 SEND_B0s1 RECV_F1s1 F1s1 B1s1 SEND_B1s1")),
      "schedule: rank 1 action 0 F mb 0 stage 1 runs before RECV_F mb 0 stage 1 (action 1), "
      "which receives its input");
}

TEST(ValidateTest, SendBeforeTheComputeThatProducesIt) {
  EXPECT_EQ(
      error_of(two_ranks("SEND_F0s0 F0s0 F1s0 SEND_F1s0 RECV_B0s0 B0s0 RECV_B1s0 B1s0", kRank1)),
      "schedule: rank 0 action 0 SEND_F mb 0 stage 0 runs before F mb 0 stage 0 (action 1), "
      "which computes what it sends");
}

TEST(ValidateTest, BackwardWithoutItsGradient) {
  // Rank 0 never posts the receive of microbatch 1's gradient (nor does rank 1 send it).
  EXPECT_EQ(error_of(two_ranks("F0s0 SEND_F0s0 F1s0 SEND_F1s0 RECV_B0s0 B0s0 B1s0",
                               "RECV_F0s1 F0s1 B0s1 SEND_B0s1 RECV_F1s1 F1s1 B1s1")),
            "schedule: rank 0 action 6 B mb 1 stage 0 needs RECV_B mb 1 stage 0 before it (which "
            "receives its output's gradient), but rank 0 has none");
}

TEST(ValidateTest, MissingBackward) {
  EXPECT_EQ(error_of(two_ranks(kRank0, "RECV_F0s1 F0s1 B0s1 SEND_B0s1 RECV_F1s1 F1s1 SEND_B1s1")),
            "schedule: rank 1 never runs B mb 1 stage 1 nor I mb 1 stage 1 (every stage runs F "
            "and B, or I and W, of each of the 2 microbatches)");
}

// Split backwards (zero-bubble schedules): I then W, each once, W after its I; I sends the
// gradient as B does.
const std::string kSplitRank1 =
    "RECV_F0s1 F0s1 I0s1 SEND_B0s1 RECV_F1s1 F1s1 I1s1 SEND_B1s1 W0s1 W1s1";

TEST(ValidateTest, SplitBackwardsAreValid) {
  EXPECT_NO_THROW(validate_schedule(two_ranks(kRank0, kSplitRank1)));
}

TEST(ValidateTest, AWeightPartBeforeItsInputPart) {
  EXPECT_THAT(error_of(two_ranks(
                  kRank0, "RECV_F0s1 F0s1 W0s1 I0s1 SEND_B0s1 RECV_F1s1 F1s1 I1s1 SEND_B1s1 W1s1")),
              HasSubstr("rank 1 action 2 W mb 0 stage 1 runs before I mb 0 stage 1 (action 3), "
                        "its input part"));
}

TEST(ValidateTest, AnInputPartWhoseWeightPartNeverRuns) {
  EXPECT_THAT(error_of(two_ranks(
                  kRank0, "RECV_F0s1 F0s1 I0s1 SEND_B0s1 RECV_F1s1 F1s1 I1s1 SEND_B1s1 W0s1")),
              HasSubstr("rank 1 runs I mb 1 stage 1 but never its W mb 1 stage 1"));
}

TEST(ValidateTest, BothAWholeAndASplitBackward) {
  EXPECT_THAT(
      error_of(two_ranks(
          kRank0, "RECV_F0s1 F0s1 B0s1 I0s1 SEND_B0s1 RECV_F1s1 F1s1 I1s1 SEND_B1s1 W0s1 W1s1")),
      HasSubstr("runs both B and I/W of microbatch 0 on stage 1"));
}

TEST(ValidateTest, AnInputPartBeforeItsForward) {
  EXPECT_THAT(error_of(two_ranks(
                  kRank0, "RECV_F0s1 I0s1 F0s1 SEND_B0s1 RECV_F1s1 F1s1 I1s1 SEND_B1s1 W0s1 W1s1")),
              HasSubstr("I mb 0 stage 1 runs before F mb 0 stage 1"));
}

TEST(ValidateTest, ReceiveBeforeTheCyclicWaitDeadlocks) {
  // Rank 0 waits for microbatch 0's gradient before sending microbatch 0's activation.
  const std::string message =
      error_of(two_ranks("F0s0 RECV_B0s0 SEND_F0s0 F1s0 SEND_F1s0 B0s0 RECV_B1s0 B1s0", kRank1));
  EXPECT_EQ(message,
            "schedule: deadlock (blocking receives, asynchronous sends): rank 0 waits at action 1 "
            "RECV_B mb 0 stage 0 for rank 1; rank 1 waits at action 0 RECV_F mb 0 stage 1 for "
            "rank 0; cycle: rank 0 -> rank 1 -> rank 0");
}

TEST(ValidateTest, SendsBothWaysDeadlockOnlyWhenSendsBlock) {
  // Rank 0 sends microbatch 1 forward while rank 1 sends microbatch 0's gradient back: fine
  // with isend, a deadlock when each send waits for the peer's receive.
  const Schedule schedule = two_ranks(kRank0, kRank1);
  EXPECT_NO_THROW(validate_schedule(schedule, {.sends = SendSemantics::kAsync}));
  EXPECT_EQ(error_of(schedule, {.sends = SendSemantics::kRendezvous}),
            "schedule: deadlock (blocking receives and sends): rank 0 waits at action 3 SEND_F mb "
            "1 stage 0 for rank 1; rank 1 waits at action 3 SEND_B mb 0 stage 1 for rank 0; "
            "cycle: rank 0 -> rank 1 -> rank 0");
}

TEST(ValidateTest, ThreeRankCycleIsNamed) {
  // Every rank receives before it sends, around a ring of microbatch dependencies.
  const Schedule schedule = Schedule::from_text(
      3, 3, 1,
      {"RECV_B0s0 F0s0 SEND_F0s0 B0s0", "RECV_F0s1 F0s1 SEND_F0s1 RECV_B0s1 B0s1 SEND_B0s1",
       "RECV_F0s2 F0s2 B0s2 SEND_B0s2"});
  // Rule 5 first: the gradient buffer needs the forward's output shape.
  EXPECT_THAT(error_of(schedule), HasSubstr("rank 0 action 0 RECV_B mb 0 stage 0 runs before F mb "
                                            "0 stage 0 (action 1)"));
  const std::string message = [&] {
    try {
      detail::check_no_deadlock(schedule, SendSemantics::kAsync);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  }();
  EXPECT_THAT(message, HasSubstr("rank 0 waits at action 0 RECV_B mb 0 stage 0 for rank 1"));
  EXPECT_THAT(message, HasSubstr("cycle: rank 0 -> rank 1 -> rank 0"));
}

TEST(ValidateTest, StageOnTheWrongRank) {
  EXPECT_EQ(error_of(two_ranks("F0s1 " + kRank0, kRank1)),
            "schedule: rank 0 action 0 F mb 0 stage 1: stage 1 lives on rank 1 (loop placement: "
            "stage s on rank s % 2), not on rank 0");
}

// The V placement (ZBV, DualPipeV): rank r holds stages r and 2p - 1 - r; the last rank's two
// middle stages hand over locally and rank 0 computes the loss.
TEST(ValidateTest, TheVPlacement) {
  const std::vector<std::string> v_lines = {
      "F0s0 SEND_F0s0 RECV_F0s3 F0s3 I0s3 SEND_B0s3 W0s3 RECV_B0s0 I0s0 W0s0",
      "RECV_F0s1 F0s1 F0s2 SEND_F0s2 RECV_B0s2 B0s2 B0s1 SEND_B0s1"};
  const Schedule v = Schedule::from_text(2, 4, 1, v_lines, "v", StagePlacement::kV);
  EXPECT_NO_THROW(validate_schedule(v));
  EXPECT_NO_THROW(validate_schedule(v, {.sends = SendSemantics::kRendezvous}));
  EXPECT_EQ(v.stages_of_rank(0), (std::vector<int>{0, 3}));
  EXPECT_EQ(v.stages_of_rank(1), (std::vector<int>{1, 2}));
  // The same lines under the loop placement put stage 3 on rank 1.
  EXPECT_EQ(error_of(Schedule::from_text(2, 4, 1, v_lines)),
            "schedule: rank 0 action 2 RECV_F mb 0 stage 3: stage 3 lives on rank 1 (loop "
            "placement: stage s on rank s % 2), not on rank 0");
  // A stage 3 on rank 1 under V is named with the V's rule.
  EXPECT_EQ(error_of(Schedule::from_text(2, 4, 1, {v_lines[0], "F0s3 " + v_lines[1]}, "v",
                                         StagePlacement::kV)),
            "schedule: rank 1 action 0 F mb 0 stage 3: stage 3 lives on rank 0 (v placement: "
            "stage s on rank s for s < 2 and on rank 3 - s after (a V)), not on rank 1");
  EXPECT_THAT(error_of(Schedule::from_text(2, 3, 1, v_lines, "v3", StagePlacement::kV)),
              HasSubstr("the V placement holds two stages per rank, so 2 ranks need 4 stages; got "
                        "3"));
  // A W that never runs, in a V.
  EXPECT_THAT(
      error_of(Schedule::from_text(
          2, 4, 1, {"F0s0 SEND_F0s0 RECV_F0s3 F0s3 I0s3 SEND_B0s3 W0s3 RECV_B0s0 I0s0", v_lines[1]},
          "v", StagePlacement::kV)),
      HasSubstr("schedule: rank 0 runs I mb 0 stage 0 but never its W mb 0 stage 0"));
}

TEST(ValidateTest, OutOfRange) {
  EXPECT_THAT(error_of(two_ranks(kRank0 + " F2s0", kRank1)),
              HasSubstr("rank 0 action 8 F mb 2 stage 0: microbatch 2 is out of range; the "
                        "schedule has 2 microbatches (0..1)"));
  EXPECT_THAT(error_of(two_ranks(kRank0 + " F0s4", kRank1)),
              HasSubstr("stage 4 is out of range; the schedule has 2 stages (0..1)"));
  EXPECT_THAT(error_of(two_ranks("RECV_F0s0 " + kRank0, kRank1)),
              HasSubstr("rank 0 action 0 RECV_F mb 0 stage 0: stage 0 has no stage -1 to receive "
                        "from (stages are 0..1)"));
}

TEST(ValidateTest, LocalStagesHandOverWithoutMessages) {
  // One rank, two stages: no send/recv between them, and stage 1 needs stage 0's forward first.
  EXPECT_NO_THROW(validate_schedule(Schedule::from_text(1, 2, 1, {"F0s0 F0s1 B0s1 B0s0"})));
  EXPECT_EQ(error_of(Schedule::from_text(1, 2, 1, {"F0s0 SEND_F0s0 F0s1 B0s1 B0s0"})),
            "schedule: rank 0 action 1 SEND_F mb 0 stage 0: stages 0 and 1 are both on rank 0; "
            "they hand tensors over locally, without SEND/RECV");
  EXPECT_EQ(error_of(Schedule::from_text(1, 2, 1, {"F0s1 F0s0 B0s1 B0s0"})),
            "schedule: rank 0 action 0 F mb 0 stage 1 runs before F mb 0 stage 0 (action 1), "
            "which computes its input");
}

TEST(ValidateTest, ShapeErrors) {
  EXPECT_THAT([] { Schedule::from_text(2, 2, 1, {"F0s0"}); },
              ::testing::ThrowsMessage<Error>(HasSubstr("got 1 lines of actions for 2 ranks")));
  EXPECT_THAT([] { parse_actions("F0s0 X1s0"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("'X1s0' is not an action")));
  EXPECT_THAT([] { parse_actions("F0"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("'F0' is not an action")));
  EXPECT_THAT([] { parse_actions("SEND_Fs1"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("'SEND_Fs1' is not an action")));
  EXPECT_EQ(parse_actions("SEND_B12s3"), (std::vector<Action>{{ActionKind::kSendB, 3, 12}}));
}

}  // namespace
}  // namespace loom::pipeline
