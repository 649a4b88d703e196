// Process group behaviour beyond single collectives: subgroups, counters, asynchronous
// operations and their order.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "base/error.h"
#include "comm/gloo/process_group_gloo.h"
#include "comm/testing/multi_rank.h"
#include "tests/comm/comm_test_util.h"
#include "tests/comm/other_device_group.h"
#include "tests/testing/tensor_checks.h"

namespace loom::comm {
namespace {

using loom::testing::expect_equal;
using loom::testing::rounded_to;
using test::make_tensor;
using testing::run_on_ranks;
using namespace std::chrono_literals;

ProcessGroupOptions sub_options(const ProcessGroup& parent, std::string name) {
  return ProcessGroupOptions{.name = std::move(name), .timeout = parent.timeout()};
}

TEST(GroupsTest, SubgroupsOfFourWithCollectivesInside) {
  run_on_ranks(4, [](ProcessGroup& pg) {
    auto even = pg.new_group({0, 2}, sub_options(pg, "even"));
    auto odd = pg.new_group({3, 1}, sub_options(pg, "odd"));  // order of the list does not matter
    const bool is_even = pg.rank() % 2 == 0;
    ASSERT_EQ(even != nullptr, is_even);
    ASSERT_EQ(odd != nullptr, !is_even);
    ProcessGroup& mine = is_even ? *even : *odd;
    EXPECT_EQ(mine.size(), 2);
    EXPECT_EQ(mine.rank(), pg.rank() / 2);
    EXPECT_EQ(mine.global_ranks(), is_even ? (std::vector<int>{0, 2}) : (std::vector<int>{1, 3}));
    EXPECT_EQ(mine.backend_name(), "gloo");

    Tensor t = make_tensor(kFloat32, 3, [&](int64_t i) { return pg.rank() + i; });
    mine.all_reduce(t)->wait();
    const double base = is_even ? 0 + 2 : 1 + 3;
    expect_equal({.actual = t,
                  .expected = rounded_to(t.dtype(), {base, base + 2, base + 4}),
                  .what = "subgroup all_reduce"});

    std::vector<Tensor> gathered = {ops::zeros({1}), ops::zeros({1})};
    mine.all_gather(gathered, ops::full({1}, pg.rank()))->wait();
    expect_equal({.actual = gathered[0],
                  .expected = rounded_to(gathered[0].dtype(), {is_even ? 0.0 : 1.0}),
                  .what = "all_gather 0"});
    expect_equal({.actual = gathered[1],
                  .expected = rounded_to(gathered[1].dtype(), {is_even ? 2.0 : 3.0}),
                  .what = "all_gather 1"});

    // The parent group still works, interleaved with the subgroups.
    Tensor all = ops::ones({1});
    pg.all_reduce(all)->wait();
    expect_equal(
        {.actual = all, .expected = rounded_to(all.dtype(), {4.0}), .what = "parent all_reduce"});
  });
}

TEST(GroupsTest, GroupsOfOneAndNestedGroups) {
  run_on_ranks(4, [](ProcessGroup& pg) {
    // Every rank takes part in every new_group call (it is collective over the parent).
    std::shared_ptr<ProcessGroup> alone;
    for (int r = 0; r < pg.size(); ++r) {
      auto group = pg.new_group({r}, sub_options(pg, fmt::format("solo{}", r)));
      if (r == pg.rank()) alone = group;
      EXPECT_EQ(group != nullptr, r == pg.rank());
    }
    ASSERT_NE(alone, nullptr);
    EXPECT_EQ(alone->size(), 1);
    Tensor t = make_tensor(kBFloat16, 4, [&](int64_t i) { return pg.rank() + i; });
    alone->all_reduce(t, ReduceOp::kAvg)->wait();
    expect_equal({.actual = t,
                  .expected = rounded_to(t.dtype(), {pg.rank() + 0.0, pg.rank() + 1.0,
                                                     pg.rank() + 2.0, pg.rank() + 3.0}),
                  .what = "solo all_reduce"});
    std::vector<Tensor> one = {ops::zeros({2})};
    alone->all_gather(one, ops::full({2}, 5))->wait();
    expect_equal({.actual = one[0],
                  .expected = rounded_to(one[0].dtype(), {5, 5}),
                  .what = "solo all_gather"});
    alone->barrier()->wait();

    // {1, 2, 3}, then its ranks {0, 2} = global {1, 3}.
    auto upper = pg.new_group({1, 2, 3}, sub_options(pg, "upper"));
    if (!upper) return;
    auto outer = upper->new_group({0, 2}, sub_options(*upper, "outer"));
    if (!outer) return;
    EXPECT_EQ(outer->global_ranks(), (std::vector<int>{1, 3}));
    Tensor x = ops::full({2}, pg.rank(), kInt64);
    outer->all_reduce(x, ReduceOp::kMax)->wait();
    expect_equal(
        {.actual = x, .expected = rounded_to(x.dtype(), {3, 3}), .what = "nested all_reduce"});
  });
}

TEST(GroupsTest, CountersCountCallsAndBytesPerKind) {
  run_on_ranks(3, [](ProcessGroup& pg) {
    pg.reset_counters();
    Tensor f = ops::ones({10});            // 40 bytes
    Tensor h = ops::ones({6}, kBFloat16);  // 12 bytes
    pg.all_reduce(f)->wait();
    pg.all_reduce(h)->wait();
    pg.broadcast(f, 0)->wait();
    std::vector<Tensor> outs = {ops::zeros({10}), ops::zeros({10}), ops::zeros({10})};
    pg.all_gather(outs, f)->wait();
    Tensor out = ops::zeros({10});
    pg.reduce_scatter(out, outs)->wait();  // 3 inputs of 40 bytes
    pg.barrier()->wait();
    const auto& c = pg.counters();
    EXPECT_EQ(c.calls_of(CollectiveKind::kAllReduce), 2);
    EXPECT_EQ(c.bytes_of(CollectiveKind::kAllReduce), 52);
    EXPECT_EQ(c.calls_of(CollectiveKind::kBroadcast), 1);
    EXPECT_EQ(c.bytes_of(CollectiveKind::kBroadcast), 40);
    EXPECT_EQ(c.calls_of(CollectiveKind::kAllGather), 1);
    EXPECT_EQ(c.bytes_of(CollectiveKind::kAllGather), 40);
    EXPECT_EQ(c.calls_of(CollectiveKind::kReduceScatter), 1);
    EXPECT_EQ(c.bytes_of(CollectiveKind::kReduceScatter), 120);
    EXPECT_EQ(c.calls_of(CollectiveKind::kBarrier), 1);
    EXPECT_EQ(c.calls_of(CollectiveKind::kAllToAll), 0);
    EXPECT_EQ(c.total_calls(), 6);
    EXPECT_EQ(pg.sequence_number(), 6u);
  });
}

// Several operations in flight at once; they run in issue order on the group's worker, so an
// all_reduce followed by a broadcast of the same tensor sees the reduced values.
TEST(GroupsTest, AsyncOperationsOverlapAndRunInIssueOrder) {
  run_on_ranks(4, [](ProcessGroup& pg) {
    std::vector<Tensor> tensors;
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < 8; ++k) {
      tensors.push_back(
          make_tensor(kFloat32, 1000, [&](int64_t i) { return pg.rank() + k + (i % 5); }));
      works.push_back(pg.all_reduce(tensors.back()));
    }
    Tensor chained = ops::full({3}, pg.rank() + 1.0);
    works.push_back(pg.all_reduce(chained));                      // 1+2+3+4 = 10
    works.push_back(pg.all_reduce(chained, ReduceOp::kProduct));  // 10^4
    std::vector<Tensor> gathered = {ops::zeros({3}), ops::zeros({3}), ops::zeros({3}),
                                    ops::zeros({3})};
    works.push_back(pg.all_gather(gathered, chained));
    // Compute while communication runs.
    double busy = 0;
    for (int i = 0; i < 100000; ++i) busy += i * 1e-9;
    EXPECT_GT(busy, 0);
    for (auto& w : works) w->wait();
    for (auto& w : works) EXPECT_TRUE(w->is_completed());
    for (int k = 0; k < 8; ++k) {
      std::vector<double> expected(1000);
      for (int64_t i = 0; i < 1000; ++i) expected[i] = 0 + 1 + 2 + 3 + 4 * (k + (i % 5));
      expect_equal({.actual = tensors[k],
                    .expected = rounded_to(tensors[k].dtype(), expected),
                    .what = fmt::format("all_reduce {}", k)});
    }
    expect_equal({.actual = chained,
                  .expected = rounded_to(chained.dtype(), {1e4, 1e4, 1e4}),
                  .what = "chained"});
    for (int r = 0; r < 4; ++r)
      expect_equal({.actual = gathered[r],
                    .expected = rounded_to(gathered[r].dtype(), {1e4, 1e4, 1e4}),
                    .what = "gathered after the chain"});
  });
}

TEST(GroupsTest, WorkCompletesWithoutWait) {
  run_on_ranks(2, [](ProcessGroup& pg) {
    Tensor t = ops::ones({4});
    auto work = pg.all_reduce(t);
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (!work->is_completed() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(1ms);
    EXPECT_TRUE(work->is_completed());
    EXPECT_EQ(work->exception(), nullptr);
    expect_equal(
        {.actual = t, .expected = rounded_to(t.dtype(), {2, 2, 2, 2}), .what = "all_reduce"});
    EXPECT_EQ(dynamic_cast<ProcessGroupGloo&>(pg).failure(), "");
  });
}

TEST(GroupsTest, ATensorOffTheGroupsDeviceIsRejectedNamingBoth) {
  run_on_ranks(1, [](ProcessGroup& pg) { EXPECT_EQ(pg.device(), Device::cpu()); });
  test::OtherDeviceGroup group;
  const Tensor t = ops::ones({4});
  const auto expect_rejected = [](const std::function<void()>& call, const std::string& op,
                                  const std::string& what) {
    try {
      call();
      ADD_FAILURE() << op << " accepted a CPU tensor on a cuda:0 group";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(),
                  ::testing::HasSubstr(fmt::format(
                      "{} on group 'elsewhere': {} is on cpu but this fake group works on cuda:0",
                      op, what)));
    }
  };
  expect_rejected([&] { group.all_reduce(t); }, "all_reduce", "the tensor");
  expect_rejected([&] { group.broadcast(t, 0); }, "broadcast", "the tensor");
  expect_rejected([&] { group.all_gather({t}, t); }, "all_gather", "the input");
  expect_rejected([&] { group.send(t, 0); }, "send", "the tensor");
  expect_rejected([&] { group.recv(t, 0); }, "recv", "the tensor");
}

}  // namespace
}  // namespace loom::comm
