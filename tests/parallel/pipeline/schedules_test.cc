// The schedule generators: exact orders for small cases (the compute order checked by hand
// against torch.distributed.pipelining's schedules), validity of every generated schedule,
// activation memory, and argument errors.
#include "parallel/pipeline/schedules.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "base/error.h"
#include "parallel/pipeline/validate.h"

namespace loom::pipeline {
namespace {

using ::testing::HasSubstr;

// The compute actions of one rank, in order ("F0s0 F1s0 B0s0 ...").
std::string compute_order(const Schedule& schedule, int rank) {
  std::string out;
  for (const Action& action : schedule.actions[rank]) {
    if (is_compute(action.kind)) out += (out.empty() ? "" : " ") + str(action);
  }
  return out;
}

TEST(SchedulesTest, GPipeRunsAllForwardsThenAllBackwards) {
  EXPECT_EQ(gpipe_schedule(2, 2).str(),
            "rank 0: F0s0 SEND_F0s0 F1s0 SEND_F1s0 RECV_B0s0 B0s0 RECV_B1s0 B1s0\n"
            "rank 1: RECV_F0s1 F0s1 RECV_F1s1 F1s1 B0s1 SEND_B0s1 B1s1 SEND_B1s1\n");
}

TEST(SchedulesTest, OneFOneBWarmsUpThenAlternates) {
  const Schedule schedule = one_f_one_b_schedule(2, 3);
  EXPECT_EQ(schedule.str(),
            "rank 0: F0s0 SEND_F0s0 F1s0 SEND_F1s0 RECV_B0s0 B0s0 F2s0 SEND_F2s0 RECV_B1s0 B1s0 "
            "RECV_B2s0 B2s0\n"
            "rank 1: RECV_F0s1 F0s1 RECV_F1s1 B0s1 SEND_B0s1 F1s1 B1s1 RECV_F2s1 SEND_B1s1 F2s1 "
            "B2s1 SEND_B2s1\n");
  // p = 4, m = 6: rank r warms up with 3 - r forwards.
  const Schedule four = one_f_one_b_schedule(4, 6);
  EXPECT_EQ(compute_order(four, 0), "F0s0 F1s0 F2s0 F3s0 B0s0 F4s0 B1s0 F5s0 B2s0 B3s0 B4s0 B5s0");
  EXPECT_EQ(compute_order(four, 2), "F0s2 F1s2 B0s2 F2s2 B1s2 F3s2 B2s2 F4s2 B3s2 F5s2 B4s2 B5s2");
  EXPECT_EQ(compute_order(four, 3), "F0s3 B0s3 F1s3 B1s3 F2s3 B2s3 F3s3 B3s3 F4s3 B4s3 F5s3 B5s3");
}

TEST(SchedulesTest, InterleavedGoesThroughLocalStagesInRoundsOfP) {
  const Schedule schedule = interleaved_one_f_one_b_schedule(2, 2, 2);
  EXPECT_EQ(schedule.num_stages, 4);
  EXPECT_EQ(schedule.str(),
            "rank 0: F0s0 SEND_F0s0 F1s0 SEND_F1s0 RECV_F0s2 F0s2 SEND_F0s2 RECV_F1s2 F1s2 "
            "SEND_F1s2 RECV_B0s2 B0s2 SEND_B0s2 RECV_B1s2 B1s2 SEND_B1s2 RECV_B0s0 B0s0 RECV_B1s0 "
            "B1s0\n"
            "rank 1: RECV_F0s1 F0s1 RECV_F1s1 SEND_F0s1 F1s1 RECV_F0s3 SEND_F1s1 F0s3 RECV_F1s3 "
            "B0s3 SEND_B0s3 F1s3 B1s3 RECV_B0s1 SEND_B1s3 B0s1 RECV_B1s1 SEND_B0s1 B1s1 "
            "SEND_B1s1\n");
  // p = 2, m = 4, v = 2 (torch's order): rank 0 warms up with (v-1)p + 2(p-1) = 4 forwards;
  // rank 1 with 2.
  const Schedule longer = interleaved_one_f_one_b_schedule(2, 4, 2);
  EXPECT_EQ(compute_order(longer, 0),
            "F0s0 F1s0 F0s2 F1s2 F2s0 B0s2 F3s0 B1s2 F2s2 B0s0 F3s2 B1s0 B2s2 B3s2 B2s0 B3s0");
  EXPECT_EQ(compute_order(longer, 1),
            "F0s1 F1s1 F0s3 B0s3 F1s3 B1s3 F2s1 B0s1 F3s1 B1s1 F2s3 B2s3 F3s3 B3s3 B2s1 B3s1");
}

TEST(SchedulesTest, EveryGeneratedScheduleIsValidEvenWithRendezvousSends) {
  for (int p = 1; p <= 4; ++p) {
    for (int m = 1; m <= 8; ++m) {
      SCOPED_TRACE(testing::Message() << "p=" << p << " m=" << m);
      auto valid = [](const Schedule& schedule) {
        EXPECT_NO_THROW(validate_schedule(schedule)) << schedule.name << "\n" << schedule.str();
        EXPECT_NO_THROW(validate_schedule(schedule, {.sends = SendSemantics::kRendezvous}))
            << schedule.name << "\n"
            << schedule.str();
      };
      valid(gpipe_schedule(p, m));
      valid(one_f_one_b_schedule(p, m));
      valid(zb_h1_schedule(p, m));
      // Interleaved: every count of equal rounds (torch's rule), r = m / rounds below p included.
      for (int v = 1; v <= 3 && m % std::max(1, m / p) == 0; ++v) {
        valid(interleaved_one_f_one_b_schedule(p, m, v));
      }
      valid(zbv_schedule(p, m));
      if (m >= 2 * p) valid(dualpipev_schedule(p, m));
    }
  }
  // The V schedules' longer runs, and more ranks.
  for (int p : {5, 6, 8}) {
    for (int m : {1, p, 2 * p - 1, 2 * p, 3 * p + 1}) {
      SCOPED_TRACE(testing::Message() << "p=" << p << " m=" << m);
      EXPECT_NO_THROW(validate_schedule(zbv_schedule(p, m), {.sends = SendSemantics::kRendezvous}));
      if (m >= 2 * p) {
        EXPECT_NO_THROW(
            validate_schedule(dualpipev_schedule(p, m), {.sends = SendSemantics::kRendezvous}));
      }
    }
  }
}

TEST(SchedulesTest, OneFOneBHoldsAtMostPMicrobatchesGPipeHoldsAll) {
  const int p = 4, m = 8;
  const Schedule gpipe = gpipe_schedule(p, m), ofob = one_f_one_b_schedule(p, m);
  for (int rank = 0; rank < p; ++rank) {
    EXPECT_EQ(peak_microbatches_in_flight(gpipe, rank), m) << "rank " << rank;
    EXPECT_EQ(peak_microbatches_in_flight(ofob, rank), p - rank) << "rank " << rank;
  }
}

// ZB-H1: 1F1B's order with each B split into I and W, rank r's W's r microbatches behind their
// I's; every rank holds at most p microbatches, 1F1B's peak.
TEST(SchedulesTest, ZeroBubbleH1DelaysRankRsWeightsByR) {
  const Schedule four = zb_h1_schedule(4, 6);
  EXPECT_EQ(compute_order(four, 0),
            "F0s0 F1s0 F2s0 F3s0 I0s0 W0s0 F4s0 I1s0 W1s0 F5s0 I2s0 W2s0 I3s0 W3s0 I4s0 W4s0 "
            "I5s0 W5s0");
  EXPECT_EQ(compute_order(four, 2),
            "F0s2 F1s2 I0s2 F2s2 I1s2 F3s2 I2s2 W0s2 F4s2 I3s2 W1s2 F5s2 I4s2 W2s2 I5s2 W3s2 "
            "W4s2 W5s2");
  const Schedule ofob = one_f_one_b_schedule(4, 8), zb = zb_h1_schedule(4, 8);
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(peak_microbatches_in_flight(zb, rank), 4) << "rank " << rank;
  }
  EXPECT_EQ(peak_microbatches_in_flight(ofob, 0), 4);
}

// ZBV: rank r holds stages r and 2p-1-r; rank 0 runs 2p-1 forwards down before the first
// microbatch comes back up to its stage 2p-1, then each up stage's F is followed by its I and W.
TEST(SchedulesTest, ZeroBubbleVTurnsAtTheLastRank) {
  const Schedule zbv = zbv_schedule(2, 4);
  EXPECT_EQ(zbv.placement, StagePlacement::kV);
  EXPECT_EQ(zbv.num_stages, 4);
  EXPECT_EQ(compute_order(zbv, 0),
            "F0s0 F1s0 F2s0 F0s3 I0s3 W0s3 F1s3 I1s3 W1s3 F3s0 I0s0 W0s0 F2s3 I2s3 W2s3 I1s0 W1s0 "
            "F3s3 I3s3 W3s3 I2s0 W2s0 I3s0 W3s0");
  EXPECT_EQ(compute_order(zbv, 1),
            "F0s1 F0s2 F1s1 F1s2 I0s2 W0s2 F2s1 I0s1 W0s1 F2s2 I1s2 W1s2 F3s1 I1s1 W1s1 F3s2 I2s2 "
            "W2s2 I2s1 I3s2 I3s1 W2s1 W3s2 W3s1");
  // Every rank holds 2p stage-microbatches at its peak (1F1B's p whole ones, at half depth).
  const Schedule eight = zbv_schedule(4, 8);
  for (int rank = 0; rank < 4; ++rank) EXPECT_EQ(peak_microbatches_in_flight(eight, rank), 8);
  // Its timeline's idle share is the V's start alone, (p-1) f of each rank's (p-1) f + 2m(f+b)
  // (F = I = W = 1 per stage), below a third of 1F1B's.
  EXPECT_NEAR(simulated_idle_share(eight, 1, 2, 1), 3.0 / (3 + 2 * 8 * 3), 1e-12);
  EXPECT_LT(simulated_idle_share(eight, 1, 2, 1),
            simulated_idle_share(one_f_one_b_schedule(4, 8), 1, 2, 1) / 3);
}

// DualPipeV: its main phase pairs F on one stage with a whole B on the other; split backwards in
// warm-up and cool-down only; it needs 2p microbatches.
TEST(SchedulesTest, DualPipeVPairsForwardsWithWholeBackwards) {
  const Schedule dual = dualpipev_schedule(2, 4);
  EXPECT_EQ(dual.placement, StagePlacement::kV);
  EXPECT_EQ(compute_order(dual, 0),
            "F0s0 F1s0 F2s0 F0s3 I0s3 W0s3 F1s3 F3s0 B1s3 F2s3 B0s0 B2s3 F3s3 B1s0 B3s3 I2s0 W2s0 "
            "I3s0 W3s0");
  EXPECT_EQ(compute_order(dual, 1),
            "F0s1 F0s2 F1s1 F1s2 F2s1 B0s2 F2s2 B0s1 F3s1 B1s2 F3s2 B1s1 B2s2 B2s1 I3s2 I3s1 W3s2 "
            "W3s1");
  EXPECT_THAT([] { dualpipev_schedule(4, 7); },
              ::testing::ThrowsMessage<Error>(
                  HasSubstr("got 7 microbatches for 4 ranks; DualPipeV's main phase needs at "
                            "least 2 x 4 = 8 (DeepSeek's num_chunks >= num_ranks * 2), or use "
                            "zbv")));
}

// Receives are placed where their message can have arrived: rank 0 of a ZBV over 4 ranks runs
// all 7 of its forwards down before it receives the first activation coming back up (the step's
// first receive on a boundary waits for the activation's shape, so an earlier one would hold
// those forwards back).
TEST(SchedulesTest, ReceivesArePostedWhenTheirMessageCanHaveArrived) {
  const Schedule zbv = zbv_schedule(4, 8);
  const auto& rank0 = zbv.actions[0];
  const auto at = [&](const std::string& text) {
    const Action action = parse_actions(text).front();
    return std::find(rank0.begin(), rank0.end(), action) - rank0.begin();
  };
  EXPECT_GT(at("RECV_F0s7"), at("F6s0"));
  EXPECT_LT(at("RECV_F0s7"), at("F0s7"));
}

// Each schedule drawn as a per-rank timeline (F = I = W = 1, B = 2; ' marks a rank's second
// stage): 1F1B's bubble, ZB-H1's W's filling it, the V's turn on the last rank.
TEST(SchedulesTest, TimelinesShowWhereTheBubbleIs) {
  EXPECT_EQ(timeline_str(one_f_one_b_schedule(2, 2)),
            "rank 0: F0  F1  .   .   B0  -   .   B1  -\n"
            "rank 1: .   F0  B0  -   F1  B1  -\n");
  EXPECT_EQ(timeline_str(zb_h1_schedule(2, 2)),
            "rank 0: F0  F1  .   I0  W0  I1  W1\n"
            "rank 1: .   F0  I0  F1  I1  W0  W1\n");
  EXPECT_EQ(timeline_str(zbv_schedule(2, 2)),
            "rank 0: F0  F1  .   F0' I0' W0' F1' I1' W1' I0  W0  .   I1  W1\n"
            "rank 1: .   F0  F0' F1  F1' I0' W0' I0  W0  I1' W1' I1  W1\n");
}

// torch 2.15's ScheduleInterleaved1F1B orders (its _calculate_single_rank_operations, printed
// for these sizes): rounds of r = m / max(1, m / p) microbatches, r > p (3 on 2 ranks, 6 on 4)
// and r < p (2 on 4).
TEST(SchedulesTest, InterleavedOrdersAreTorchs) {
  struct Case {
    int p, m, v;
    std::vector<std::string> orders;  // each rank's compute actions, torch's
  };
  const std::vector<Case> cases = {
      {2,
       3,
       2,
       {"F0s0 F1s0 F2s0 F0s2 F1s2 F2s2 B0s2 B1s2 B2s2 B0s0 B1s0 B2s0",
        "F0s1 F1s1 F2s1 F0s3 B0s3 F1s3 B1s3 F2s3 B2s3 B0s1 B1s1 B2s1"}},
      {4,
       6,
       2,
       {"F0s0 F1s0 F2s0 F3s0 F4s0 F5s0 F0s4 F1s4 F2s4 F3s4 F4s4 F5s4 B0s4 B1s4 B2s4 B3s4 B4s4 B5s4 "
        "B0s0 B1s0 B2s0 B3s0 B4s0 B5s0",
        "F0s1 F1s1 F2s1 F3s1 F4s1 F5s1 F0s5 F1s5 F2s5 F3s5 F4s5 B0s5 F5s5 B1s5 B2s5 B3s5 B4s5 B5s5 "
        "B0s1 B1s1 B2s1 B3s1 B4s1 B5s1",
        "F0s2 F1s2 F2s2 F3s2 F4s2 F5s2 F0s6 F1s6 F2s6 B0s6 F3s6 B1s6 F4s6 B2s6 F5s6 B3s6 B4s6 B5s6 "
        "B0s2 B1s2 B2s2 B3s2 B4s2 B5s2",
        "F0s3 F1s3 F2s3 F3s3 F4s3 F5s3 F0s7 B0s7 F1s7 B1s7 F2s7 B2s7 F3s7 B3s7 F4s7 B4s7 F5s7 B5s7 "
        "B0s3 B1s3 B2s3 B3s3 B4s3 B5s3"}},
      {4,
       2,
       2,
       {"F0s0 F1s0 F0s4 F1s4 B0s4 B1s4 B0s0 B1s0", "F0s1 F1s1 F0s5 F1s5 B0s5 B1s5 B0s1 B1s1",
        "F0s2 F1s2 F0s6 F1s6 B0s6 B1s6 B0s2 B1s2", "F0s3 F1s3 F0s7 B0s7 F1s7 B1s7 B0s3 B1s3"}},
  };
  for (const Case& c : cases) {
    const Schedule il = interleaved_one_f_one_b_schedule(c.p, c.m, c.v);
    for (int rank = 0; rank < c.p; ++rank) {
      EXPECT_EQ(compute_order(il, rank), c.orders[rank])
          << "p=" << c.p << " m=" << c.m << " rank " << rank;
    }
  }
}

// torch's rule: max(1, m / p) rounds of equal size. 6 on 4 ranks is one round of 6, 2 one of 2;
// 9 would be two rounds of 4.5.
TEST(SchedulesTest, InterleavedRunsEqualRoundsOfMicrobatches) {
  for (const int m : {2, 6, 8, 12}) {
    const Schedule schedule = interleaved_one_f_one_b_schedule(4, m, 2);
    EXPECT_EQ(schedule.num_microbatches, m);
    for (const auto& rank : schedule.actions) {
      int forwards = 0, backwards = 0;
      for (const Action& action : rank) {
        forwards += action.kind == ActionKind::kForward;
        backwards += action.kind == ActionKind::kBackward;
      }
      EXPECT_EQ(forwards, 2 * m) << m;  // each microbatch on each of the rank's 2 stages
      EXPECT_EQ(backwards, 2 * m) << m;
    }
  }
  try {
    interleaved_one_f_one_b_schedule(4, 9, 2);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("9 microbatches do not split into 2 equal rounds"));
    EXPECT_THAT(e.what(), HasSubstr("e.g. 8 or 10 microbatches"));
  }
  // Both counts suggested split: 22 on 4 ranks (5 rounds of 4.4) suggests 20 and 24, not 25.
  EXPECT_THAT([] { interleaved_one_f_one_b_schedule(4, 22, 2); },
              ::testing::ThrowsMessage<Error>(HasSubstr("e.g. 20 or 24 microbatches")));
}

TEST(SchedulesTest, BadArgumentsAreNamed) {
  EXPECT_THAT([] { gpipe_schedule(0, 4); },
              ::testing::ThrowsMessage<Error>(HasSubstr("gpipe_schedule: got 0 ranks")));
  EXPECT_THAT(
      [] { one_f_one_b_schedule(2, 0); },
      ::testing::ThrowsMessage<Error>(HasSubstr("one_f_one_b_schedule: got 0 microbatches")));
  EXPECT_THAT([] { interleaved_one_f_one_b_schedule(2, 2, 0); },
              ::testing::ThrowsMessage<Error>(HasSubstr("got 0 stages per rank")));
}

}  // namespace
}  // namespace loom::pipeline
