// Per-step fault tolerance across replicas: three replicas (threads, each its own Gloo groups over
// one shared store) train a small linear model with momentum SGD. Replica 2 leaves before step 3;
// replica 1 fails in the middle of step 5 (it joined the quorum, then its group went away before
// the average); replica 2 comes back after step 6 and replica 1 after step 9, each as a fresh
// replica whose state it gets from a member. The job never stops (replica 0 runs every step),
// each step's gradient is the mean over that step's members, and every replica ends with the
// parameters and momentum of a reference that replays the recorded membership (1e-6).
#include "parallel/ft/replica_group.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <thread>
#include <vector>

#include "base/error.h"
#include "comm/in_memory_store.h"
#include "comm/tcp_store.h"
#include "tensor/ops.h"
#include "tests/testing/tensor_checks.h"

namespace loom::parallel::ft {
namespace {

constexpr int kReplicas = 3;
constexpr int64_t kSteps = 14;
constexpr double kLr = 0.05, kMomentum = 0.9;

// This replica's batch at a step: a function of (step, replica) only.
Tensor inputs(int64_t step, int replica) {
  return ops::uniform({8, 3}, 1000 * step + replica, -1.0, 1.0);
}
Tensor targets(int64_t step, int replica) {
  return ops::uniform({8, 4}, 5000 + 1000 * step + replica, -1.0, 1.0);
}
// d/dW of mean((x W^T - y)^2 summed over outputs) / rows: (2 / rows) (x W^T - y)^T x.
Tensor gradient(const Tensor& w, int64_t step, int replica) {
  const Tensor x = inputs(step, replica);
  const Tensor error = ops::sub(ops::matmul(x, ops::transpose(w, 0, 1)), targets(step, replica));
  return ops::mul(ops::matmul(ops::transpose(error, 0, 1), x), 2.0 / 8.0);
}
Tensor initial_weights() { return ops::uniform({4, 3}, 42, -0.5, 0.5); }

struct State {
  Tensor w = ops::clone(initial_weights());
  Tensor momentum = ops::zeros({4, 3});
  int64_t steps_done = 0;
};

void apply(State& s, const Tensor& grad) {
  ops::copy_(s.momentum, ops::add(ops::mul(s.momentum, kMomentum), grad));
  ops::copy_(s.w, ops::sub(s.w, ops::mul(s.momentum, kLr)));
}

struct Outcome {
  State state;
  std::map<int64_t, std::vector<int>> participants;
  int64_t first_step = 0;
  std::map<int64_t, int> attempts;  // steps that needed more than one attempt
};

// One replica's life: it joins the round after the latest, runs the step its quorum decides
// until `last_step` (exclusive), and in step `fail_at` joins the quorum and then leaves without
// averaging.
Outcome run_replica(std::shared_ptr<comm::Store> store, int replica, int64_t last_step,
                    int64_t fail_at = -1,
                    comm::Duration join_window = std::chrono::milliseconds(200)) {
  ReplicaGroup group(store, replica, kReplicas,
                     {.join_window = join_window, .member_wait = std::chrono::milliseconds(400)});
  Outcome out;
  out.first_step = -1;
  while (out.state.steps_done < last_step) {
    const int64_t round = group.next_round();
    for (int attempt = 0;; ++attempt) {
      const StepQuorum q = group.start_round(round, attempt, out.state.steps_done);
      EXPECT_TRUE(q.member()) << "replica " << replica << " round " << round;
      if (!q.member()) break;
      if (q.step == fail_at) return out;  // its group goes with `group`, mid-step
      if (q.needs_state_sync) {
        if (!group.sync_state({out.state.w, out.state.momentum})) continue;
        out.state.steps_done = q.step;
      }
      if (out.first_step < 0) out.first_step = q.step;
      const Tensor grad = gradient(out.state.w, q.step, replica);
      if (group.average({grad})) {
        apply(out.state, grad);
        out.state.steps_done = q.step + 1;
        group.commit();
        if (attempt > 0) out.attempts[q.step] = attempt;
        break;
      }
    }
  }
  out.participants = group.participants();
  return out;
}

// Waits until the job has decided round `round` (what a replica coming back watches for). Rounds
// are steps in this job: replica 0 takes part in every round, each a step.
void wait_for_round(comm::Store& store, int64_t round) {
  while (!store.check({"ft/latest"}) || store.add("ft/latest", 0) < round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

TEST(ReplicaGroupTest, ReplicasLeaveFailAndRejoinWithoutStoppingTheJob) {
  auto store = std::make_shared<comm::InMemoryStore>();
  Outcome r0, r1_first, r2_first, r2_back, r1_back;
  std::thread t0([&] { r0 = run_replica(store, 0, kSteps); });
  std::thread t1([&] { r1_first = run_replica(store, 1, kSteps, /*fail_at=*/5); });
  std::thread t2([&] { r2_first = run_replica(store, 2, /*last_step=*/3); });
  t2.join();
  t1.join();
  std::thread t2b([&] {
    wait_for_round(*store, 6);
    r2_back = run_replica(store, 2, kSteps);
  });
  std::thread t1b([&] {
    wait_for_round(*store, 9);
    r1_back = run_replica(store, 1, kSteps);
  });
  t0.join();
  t2b.join();
  t1b.join();

  // Replica 0 took part in every step; the record says who else did.
  ASSERT_EQ(static_cast<int64_t>(r0.participants.size()), kSteps);
  const auto& who = r0.participants;
  EXPECT_EQ(who.at(0), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(who.at(3), (std::vector<int>{0, 1}));  // replica 2 left
  EXPECT_EQ(who.at(5), (std::vector<int>{0}));     // replica 1 failed mid-step: retried without it
  EXPECT_TRUE(r0.attempts.contains(5)) << "step 5 needed a second attempt";
  EXPECT_GE(r2_back.first_step, 7);
  EXPECT_GE(r1_back.first_step, 10);
  EXPECT_EQ(who.at(kSteps - 1), (std::vector<int>{0, 1, 2}));  // both came back
  for (const auto& [step, members] : r2_back.participants) EXPECT_EQ(members, who.at(step));

  // The reference: the recorded membership replayed on one "replica".
  State reference;
  for (int64_t step = 0; step < kSteps; ++step) {
    Tensor sum = ops::zeros({4, 3});
    for (int r : who.at(step)) sum = ops::add(sum, gradient(reference.w, step, r));
    apply(reference, ops::div(sum, static_cast<double>(who.at(step).size())));
  }
  const std::vector<std::pair<std::string, const Outcome*>> finished = {
      {"replica 0", &r0}, {"replica 1 (back)", &r1_back}, {"replica 2 (back)", &r2_back}};
  for (const auto& [name, outcome] : finished) {
    loom::testing::expect_close({.actual = outcome->state.w,
                                 .expected = reference.w,
                                 .tol = {.atol = 1e-6},
                                 .what = name + " weights"});
    loom::testing::expect_close({.actual = outcome->state.momentum,
                                 .expected = reference.momentum,
                                 .tol = {.atol = 1e-6},
                                 .what = name + " momentum"});
  }
}

// A replica never runs a step whose state it does not hold. Replica 0 runs alone to the end; a
// replica 1 started afterwards, against the same store (the lighthouse of a job that finished),
// starts from its own state at step 0 — not at the finished job's next step — and so does a
// new job's pair of replicas after it.
TEST(ReplicaGroupTest, ReplicasAfterAFinishedJobStartFromTheirOwnState) {
  auto store = std::make_shared<comm::InMemoryStore>();
  const Outcome alone = run_replica(store, 0, 3);
  EXPECT_EQ(alone.first_step, 0);
  EXPECT_EQ(store->get_string("ft/latest"), "2");  // its three rounds
  const Outcome later = run_replica(store, 1, 3);
  EXPECT_EQ(later.first_step, 0);
  EXPECT_EQ(later.participants.size(), 3u);
  for (const auto& [step, members] : later.participants) {
    EXPECT_EQ(members, (std::vector<int>{1})) << "step " << step;
  }
  Outcome pair[2];
  // (A window long enough that neither misses a round on a loaded machine.)
  const comm::Duration window = std::chrono::milliseconds(600);
  std::thread t0([&] { pair[0] = run_replica(store, 0, 4, -1, window); });
  std::thread t1([&] { pair[1] = run_replica(store, 1, 4, -1, window); });
  t0.join();
  t1.join();
  State reference;
  for (int64_t step = 0; step < 4; ++step) {
    Tensor sum = ops::zeros({4, 3});
    for (int r : pair[0].participants.at(step)) sum = ops::add(sum, gradient(reference.w, step, r));
    apply(reference, ops::div(sum, static_cast<double>(pair[0].participants.at(step).size())));
  }
  for (const Outcome& outcome : pair) {
    EXPECT_EQ(outcome.participants, pair[0].participants);
    EXPECT_GE(outcome.first_step, 0);
    loom::testing::expect_close({.actual = outcome.state.w,
                                 .expected = reference.w,
                                 .tol = {.atol = 1e-6},
                                 .what = "the new pair's weights"});
  }
  EXPECT_EQ(pair[0].participants.at(3), (std::vector<int>{0, 1}));
}

// Runs start_round on every group at once (each in its thread); what each returned or threw.
struct RoundResult {
  StepQuorum quorum;
  std::string input_error;  // a loom::InputError's message
};
std::vector<RoundResult> join_round(const std::vector<ReplicaGroup*>& groups, int64_t round,
                                    const std::vector<int64_t>& states) {
  std::vector<RoundResult> results(groups.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < groups.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        results[i].quorum = groups[i]->start_round(round, 0, states[i]);
      } catch (const InputError& e) {
        results[i].input_error = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

// A step that outlasts the join window does not split the replicas: a round's decider waits up
// to member_wait for the replicas it met last (their steps may be slower), so they stay in one
// round, where with the window alone each would decide rounds by itself and train apart.
TEST(ReplicaGroupTest, ReplicasSlowerThanTheJoinWindowStayTogether) {
  auto store = std::make_shared<comm::InMemoryStore>();
  const ReplicaGroupOptions options{.join_window = std::chrono::milliseconds(5),
                                    .member_wait = std::chrono::seconds(20)};
  ReplicaGroup r0(store, 0, 2, options), r1(store, 1, 2, options);
  ASSERT_EQ(join_round({&r0, &r1}, 0, {0, 0})[0].quorum.members, (std::vector<int>{0, 1}));
  for (int64_t round = 1; round <= 2; ++round) {
    StepQuorum q1;
    std::thread slow([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a slower step
      q1 = r1.start_round(round, 0, round);
    });
    const StepQuorum q0 = r0.start_round(round, 0, round);
    slow.join();
    EXPECT_EQ(q0.members, (std::vector<int>{0, 1})) << "round " << round;
    EXPECT_EQ(q1.members, (std::vector<int>{0, 1})) << "round " << round;
  }
}

// Two jobs given one replica id: the one that took part before stays, the newcomer is refused by
// name (a job exits 2 on InputError), and the members' group works without it.
TEST(ReplicaGroupTest, ASecondJobRunningTheSameReplicaIsRefused) {
  auto store = std::make_shared<comm::InMemoryStore>();
  // Three ids, of which two run: every decider waits out its window, so all entries are in.
  const auto options = [](std::string description) {
    return ReplicaGroupOptions{.join_window = std::chrono::milliseconds(300),
                               .description = std::move(description),
                               .job = "the job"};
  };
  ReplicaGroup r0(store, 0, kReplicas, options("pid 10 on a")),
      r1(store, 1, kReplicas, options("pid 11 on b")),
      r1_again(store, 1, kReplicas, options("pid 99 on c"));
  const std::vector<RoundResult> first = join_round({&r0, &r1}, 0, {0, 0});
  ASSERT_EQ(first[1].quorum.members, (std::vector<int>{0, 1}));
  // Left out of rounds 1 and 2 (a dead predecessor's entry would be gone by then), refused at
  // the third round in a row that the running replica 1 joins too.
  for (int64_t round : {1, 2}) {
    const std::vector<RoundResult> left_out =
        join_round({&r1_again, &r0, &r1}, round, {0, round, round});
    EXPECT_EQ(left_out[0].input_error, "") << "round " << round;
    EXPECT_FALSE(left_out[0].quorum.member()) << "round " << round;
    EXPECT_EQ(left_out[2].quorum.members, (std::vector<int>{0, 1}));
    EXPECT_EQ(left_out[2].quorum.index, 1);
    // The members run the round (their group works without the newcomer).
    Tensor a = ops::full({1}, 1.0), b = ops::full({1}, 3.0);
    std::thread t([&] {
      EXPECT_TRUE(r0.average({a}));
      r0.commit();
    });
    EXPECT_TRUE(r1.average({b}));
    r1.commit();
    t.join();
  }
  const std::vector<RoundResult> second = join_round({&r1_again, &r0, &r1}, 3, {0, 3, 3});
  EXPECT_EQ(second[0].input_error,
            "--replica 1: another job already runs replica 1 against this replica store (pid 11 "
            "on b; this job is pid 99 on c): give each replica job its own --replica in [0, 3), "
            "or stop the other first");
  for (int i : {1, 2}) {
    EXPECT_EQ(second[i].input_error, "");
    EXPECT_EQ(second[i].quorum.members, (std::vector<int>{0, 1}));
    EXPECT_EQ(second[i].quorum.step, 3);
    EXPECT_EQ(second[i].quorum.index, i - 1);
  }
  // The members average with each other only.
  Tensor g0 = ops::full({2}, 1.0), g1 = ops::full({2}, 3.0);
  std::thread t0([&] { EXPECT_TRUE(r0.average({g0})); });
  EXPECT_TRUE(r1.average({g1}));
  t0.join();
  loom::testing::expect_close(
      {.actual = g0, .expected = ops::full({2}, 2.0), .tol = {.atol = 0}, .what = "replica 0"});
}

// A newcomer that reaches a round first, and decides it, cannot take a running replica's id:
// it waits for the round before's processes (member_wait, past its short window) and keeps
// their ids for them.
TEST(ReplicaGroupTest, ANewcomerDecidingARoundWaitsForTheRunningReplicas) {
  auto store = std::make_shared<comm::InMemoryStore>();
  const ReplicaGroupOptions options{.join_window = std::chrono::milliseconds(5),
                                    .member_wait = std::chrono::seconds(20)};
  ReplicaGroup r0(store, 0, 2, options), r1(store, 1, 2, options), again(store, 1, 2, options);
  ASSERT_EQ(join_round({&r0, &r1}, 0, {0, 0})[0].quorum.members, (std::vector<int>{0, 1}));
  StepQuorum newcomer;
  std::thread first([&] { newcomer = again.start_round(1, 0, 0); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the running ones come later
  const std::vector<RoundResult> running = join_round({&r0, &r1}, 1, {1, 1});
  first.join();
  EXPECT_FALSE(newcomer.member());
  EXPECT_EQ(running[1].quorum.members, (std::vector<int>{0, 1}));
  EXPECT_EQ(running[1].quorum.index, 1);
}

// A replica restarted while the survivor still retries the round its dead predecessor broke (a
// connect timeout can outlast member_wait) waits for the survivor instead of deciding a round
// alone and training from fresh weights (found from outside: a replica killed twice).
TEST(ReplicaGroupTest, ARestartedReplicaWaitsWhileTheRoundBeforeIsRetried) {
  auto store = std::make_shared<comm::InMemoryStore>();
  store->set("ft/latest", std::string("4"));
  store->set("ft/round4/final",
             std::string(R"({"members": [{"replica": 0, "state": 4, "state_round": 3, )"
                         R"("instance": "000000000000000a"}, {"replica": 1, "state": 4, )"
                         R"("state_round": 3, "instance": "00000000000000dd"}], )"
                         R"("refused": [], "attempt": 0})"));
  ASSERT_EQ(store->add("ft/round4/attempt1/decider", 1), 1);  // the survivor's retry
  const auto options = [](uint64_t instance) {
    return ReplicaGroupOptions{.join_window = std::chrono::milliseconds(20),
                               .member_wait = std::chrono::milliseconds(100),
                               .instance = instance};
  };
  ReplicaGroup survivor(store, 0, 2, options(0xa)), restarted(store, 1, 2, options(0xbb));
  StepQuorum fresh;
  std::thread first([&] { fresh = restarted.start_round(5, 0, 0); });
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // the retry and its step
  const StepQuorum q = survivor.start_round(5, 0, 5);
  first.join();
  EXPECT_EQ(fresh.members, (std::vector<int>{0, 1}));
  EXPECT_EQ(q.members, (std::vector<int>{0, 1}));
  EXPECT_EQ(fresh.step, 5);
  EXPECT_TRUE(fresh.needs_state_sync);
}

// A replica whose settings differ from the running replicas' is refused, naming both: the
// replicas that took part before set them (here replica 1), whatever the newcomer's id.
TEST(ReplicaGroupTest, AReplicaWithOtherSettingsIsRefused) {
  auto store = std::make_shared<comm::InMemoryStore>();
  const auto options = [](std::string job) {
    return ReplicaGroupOptions{.join_window = std::chrono::milliseconds(300),
                               .job = std::move(job)};
  };
  ReplicaGroup r1(store, 1, kReplicas, options("seed 1, layout tp=2")),
      r0(store, 0, kReplicas, options("seed 1, layout tp=1"));
  ASSERT_EQ(join_round({&r1}, 0, {0})[0].quorum.members, (std::vector<int>{1}));
  const std::vector<RoundResult> second = join_round({&r0, &r1}, 1, {0, 1});
  EXPECT_EQ(second[0].input_error,
            "--replica 0: this job's settings differ from the running replicas' (this job: seed 1, "
            "layout tp=1; replica 1's: seed 1, layout tp=2): replicas of one job need the same "
            "model, data, seed, batch, sequence length, layout and training settings");
  EXPECT_EQ(second[1].quorum.members, (std::vector<int>{1}));
  EXPECT_EQ(second[1].quorum.step, 1);
}

// Two replicas that ran the same step apart (each in a round without the other: one was late)
// hold different states at the same step; when they meet again the later round's state is the
// one both go on from, so they never average gradients of different weights.
TEST(ReplicaGroupTest, ReplicasThatRanAStepApartGoOnFromOneState) {
  auto store = std::make_shared<comm::InMemoryStore>();
  const ReplicaGroupOptions options{.join_window = std::chrono::milliseconds(100),
                                    .member_wait = std::chrono::milliseconds(100)};
  ReplicaGroup r0(store, 0, kReplicas, options), r1(store, 1, kReplicas, options);
  const auto run_step = [](ReplicaGroup& group, const StepQuorum& q) {
    Tensor g = ops::full({1}, 1.0);
    EXPECT_TRUE(group.average({g}));
    group.commit();
    return q.step + 1;
  };
  std::vector<RoundResult> both = join_round({&r0, &r1}, 0, {0, 0});
  ASSERT_EQ(both[0].quorum.members, (std::vector<int>{0, 1}));
  EXPECT_FALSE(both[0].quorum.needs_state_sync);  // fresh replicas start alike
  int64_t s0 = 0, s1 = 0;
  std::thread t([&] { s1 = run_step(r1, both[1].quorum); });
  s0 = run_step(r0, both[0].quorum);
  t.join();
  // Round 1 without replica 0, round 2 without replica 1: each runs step 1 alone.
  const StepQuorum alone1 = join_round({&r1}, 1, {s1})[0].quorum;
  ASSERT_EQ(alone1.members, (std::vector<int>{1}));
  s1 = run_step(r1, alone1);
  const StepQuorum alone0 = join_round({&r0}, 2, {s0})[0].quorum;
  ASSERT_EQ(alone0.members, (std::vector<int>{0}));
  EXPECT_EQ(alone0.step, 1);
  s0 = run_step(r0, alone0);
  ASSERT_EQ(s0, s1);  // both at step 2, from different step-1 updates
  both = join_round({&r0, &r1}, 3, {s0, s1});
  for (const RoundResult& result : both) {
    EXPECT_EQ(result.quorum.step, 2);
    EXPECT_TRUE(result.quorum.needs_state_sync);
    EXPECT_EQ(result.quorum.source, 0);  // replica 0's state, made in round 2
  }
  Tensor w0 = ops::full({2}, 7.0), w1 = ops::full({2}, -1.0);
  std::thread sync1([&] { EXPECT_TRUE(r1.sync_state({w1})); });
  EXPECT_TRUE(r0.sync_state({w0}));
  sync1.join();
  loom::testing::expect_close(
      {.actual = w1, .expected = w0, .tol = {.atol = 0}, .what = "replica 1's state"});
  // Synced, they hold one state: the next round needs none.
  std::thread t2([&] { s1 = run_step(r1, both[1].quorum); });
  s0 = run_step(r0, both[0].quorum);
  t2.join();
  both = join_round({&r0, &r1}, 4, {s0, s1});
  EXPECT_FALSE(both[0].quorum.needs_state_sync);
  EXPECT_EQ(both[0].quorum.step, 3);
}

// The quorum service failing ends the replica with an error that says what failed.
class GoneStore : public comm::Store {
 public:
  void set(const std::string&, const comm::Bytes&) override { LOOM_FAIL("connection refused"); }
  comm::Bytes get(const std::string&) override { LOOM_FAIL("connection refused"); }
  int64_t add(const std::string&, int64_t) override { LOOM_FAIL("connection refused"); }
  bool check(const std::vector<std::string>&) override { LOOM_FAIL("connection refused"); }
  void wait(const std::vector<std::string>&, comm::Duration) override {
    LOOM_FAIL("connection refused");
  }
  bool delete_key(const std::string&) override { LOOM_FAIL("connection refused"); }
  comm::Bytes compare_set(const std::string&, const comm::Bytes&, const comm::Bytes&) override {
    LOOM_FAIL("connection refused");
  }
};

TEST(ReplicaGroupTest, ALostQuorumStoreIsNamed) {
  ReplicaGroup group(std::make_shared<GoneStore>(), 1, 2, {.local_key = "rank0"});
  try {
    group.start_round(7, 0, 7);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(
                              "ReplicaGroup 'rank0': replica 1: the quorum of round 7 (attempt 0) "
                              "failed: connection refused (the replicas' shared store — a "
                              "lighthouse — must outlive every replica"));
  }
}

// The decider of a step's quorum dies in its join window (it joined and claimed the decision, then
// never published): the others publish after the window and the grace, all read the same members
// (the dead one among them: its group then fails to form), and nobody waits out the timeout.
// `stores[r]`: replica r's connection to the shared store (one object in memory, or a TcpStore
// client each, as jobs have).
void expect_a_dead_decider_replaced(const std::vector<std::shared_ptr<comm::Store>>& stores) {
  comm::Store& dead = *stores[2];
  ASSERT_EQ(dead.add("ft/round4/attempt0/slots/2", 1), 1);
  dead.set(
      "ft/round4/attempt0/join/2/1",
      std::string(R"({"replica": 2, "state": 4, "state_round": 3, "instance": "00000000000000dd", )"
                  R"("veteran": true, "job": "", "description": "the dead one"})"));
  ASSERT_EQ(dead.add("ft/round4/attempt0/decider", 1), 1);  // replica 2 decides, then dies
  const ReplicaGroupOptions options{.join_window = std::chrono::milliseconds(100),
                                    .timeout = std::chrono::seconds(20),
                                    .decider_grace = std::chrono::milliseconds(200),
                                    .member_wait = std::chrono::milliseconds(100),
                                    .connect_timeout = std::chrono::milliseconds(300)};
  std::vector<StepQuorum> quorums(2);
  std::vector<std::string> errors(2);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> replicas;
  for (int r = 0; r < 2; ++r) {
    replicas.emplace_back([&, r] {
      try {
        ReplicaGroup group(stores[r], r, kReplicas, options);
        quorums[r] = group.start_round(4, 0, 4);
      } catch (const Error& e) {
        errors[r] = e.what();
      }
    });
  }
  for (std::thread& t : replicas) t.join();
  const double waited_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(errors[r], "") << "replica " << r;
    EXPECT_EQ(quorums[r].members, (std::vector<int>{0, 1, 2})) << "replica " << r;
    EXPECT_EQ(quorums[r].index, r);
  }
  EXPECT_GE(waited_s, 0.3);   // the window and the grace
  EXPECT_LT(waited_s, 10.0);  // not the timeout
  // The list was written once, and the latest decided step is this one: both survivors may
  // have published, and neither pushed it past 4.
  EXPECT_EQ(dead.get_string("ft/round4/attempt0/members"),
            stores[0]->get_string("ft/round4/attempt0/members"));
  EXPECT_EQ(dead.get_string("ft/latest"), "4");
}

// A decider that stalls instead of dying publishes after the others did: its late list (here
// without replica 1, which it never saw) is not written, and it reads the published one back.
TEST(ReplicaGroupTest, ALateDeciderReadsTheListAlreadyPublished) {
  auto store = std::make_shared<comm::InMemoryStore>();
  store->set(
      "ft/round4/attempt0/members",
      std::string(
          R"({"members": [{"replica": 0, "state": 4, "state_round": 3, "instance": "a"}, )"
          R"({"replica": 1, "state": 4, "state_round": 3, "instance": "b"}, )"
          R"({"replica": 2, "state": 4, "state_round": 3, "instance": "c"}], "refused": []})"));
  store->set("ft/latest", std::string("9"));  // a later round decided meanwhile
  const ReplicaGroupOptions options{.join_window = std::chrono::milliseconds(50),
                                    .timeout = std::chrono::seconds(20),
                                    .connect_timeout = std::chrono::milliseconds(300)};
  ReplicaGroup late(store, 0, kReplicas, options);
  const StepQuorum quorum = late.start_round(4, 0, 4);  // the decider: no one else joins
  EXPECT_EQ(quorum.members, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(store->get_string("ft/latest"), "9");  // never lowered
}

// The decider of a step's quorum dies in its join window (it joined and claimed the decision, then
// never published): the others publish after the window and the grace, all read the same members
// (the dead one among them: its group then fails to form), and nobody waits out the timeout.
TEST(ReplicaGroupTest, ADeciderThatDiesBeforePublishingIsReplaced) {
  auto store = std::make_shared<comm::InMemoryStore>();
  expect_a_dead_decider_replaced({store, store, store});
}

TEST(ReplicaGroupTest, ADeciderThatDiesBeforePublishingIsReplacedOverTcp) {
  auto server =
      std::make_shared<comm::TcpStore>("127.0.0.1", 0, comm::TcpStoreOptions{.is_server = true});
  std::vector<std::shared_ptr<comm::Store>> clients;
  for (int r = 0; r < kReplicas; ++r) {
    clients.push_back(std::make_shared<comm::TcpStore>("127.0.0.1", server->port()));
  }
  expect_a_dead_decider_replaced(clients);
}

}  // namespace
}  // namespace loom::parallel::ft
