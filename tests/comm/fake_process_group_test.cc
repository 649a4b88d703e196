// FakeProcessGroup (comm/fake/fake_process_group.h): operations counted as on a real backend,
// nothing moved except small meta values; sends pair with receives between traced ranks; a
// receive with no send fails after the timeout or at once after abort(); unpaired messages are
// listed; bad worlds are errors naming the rank.
#include "comm/fake/fake_process_group.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "tensor/ops.h"
#include "tests/testing/errors.h"

namespace loom::comm {
namespace {

using testing::error_of;
using ::testing::HasSubstr;

TEST(FakeProcessGroup, CountsOperationsAndMovesNothingButSmallValues) {
  const auto groups = FakeProcessGroup::create_world(4, {2});
  ProcessGroup& pg = *groups[0];
  EXPECT_EQ(pg.rank(), 2);
  EXPECT_EQ(pg.size(), 4);
  EXPECT_TRUE(pg.device().is_meta());
  const Tensor big = ops::empty({1024}, kFloat32, Device::meta());
  pg.all_reduce(big)->wait();
  EXPECT_EQ(pg.counters().calls_of(CollectiveKind::kAllReduce), 1);
  EXPECT_EQ(pg.counters().bytes_of(CollectiveKind::kAllReduce), 4096);
  // all_gather: peers like this rank, its input in every output.
  const Tensor mine = ops::from_vector_i64({7, 9}, {2}, Device::meta());
  std::vector<Tensor> all;
  for (int r = 0; r < 4; ++r) all.push_back(ops::zeros({2}, kInt64, Device::meta()));
  pg.all_gather(all, mine)->wait();
  for (const Tensor& t : all) EXPECT_EQ(ops::to_vector(t), (std::vector<double>{7, 9}));
  // Tensors must be on the group's device.
  EXPECT_THAT(error_of([&] { pg.all_reduce(ops::zeros({2})); }), HasSubstr("meta"));
  // Sub-groups are fake too, and a recv from a rank that is not traced completes at once.
  const auto sub = pg.new_group({1, 2}, {.name = "pair"});
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->backend_name(), "fake");
  sub->recv(ops::empty({4}, kFloat32, Device::meta()), 0)->wait();
}

TEST(FakeProcessGroup, SendsPairWithReceivesBetweenTracedRanks) {
  const auto groups = FakeProcessGroup::create_world(2, {0, 1});
  std::vector<double> received;
  std::thread receiver([&] {
    const Tensor into = ops::zeros({3}, kInt64, Device::meta());
    groups[1]->recv(into, 0, /*tag=*/5)->wait();
    received = ops::to_vector(into);
  });
  groups[0]->send(ops::from_vector_i64({1, 2, 3}, {3}, Device::meta()), 1, 5)->wait();
  receiver.join();
  EXPECT_EQ(received, (std::vector<double>{1, 2, 3}));
  EXPECT_TRUE(static_cast<FakeProcessGroup&>(*groups[0]).unmatched_messages().empty());
}

TEST(FakeProcessGroup, UnpairedMessagesFailOrAreListed) {
  const auto groups =
      FakeProcessGroup::create_world(2, {0, 1}, {.timeout = std::chrono::milliseconds(50)});
  auto& fake = static_cast<FakeProcessGroup&>(*groups[0]);
  const std::string late =
      error_of([&] { groups[0]->recv(ops::empty({4}, kFloat32, Device::meta()), 1, 3)->wait(); });
  EXPECT_THAT(late, HasSubstr("from rank 1, tag 3"));
  EXPECT_THAT(late, HasSubstr("no matching send within 50 ms"));
  groups[1]->send(ops::empty({4}, kFloat32, Device::meta()), 0, 8)->wait();
  const auto unmatched = fake.unmatched_messages();
  ASSERT_EQ(unmatched.size(), 2u);  // the timed-out recv, the send no one took
  EXPECT_THAT(unmatched[0], HasSubstr("1 send from rank 1 to rank 0 (tag 8) never received"));
  EXPECT_THAT(unmatched[1], HasSubstr("1 recv on rank 0 from rank 1 (tag 3) never sent"));
  // After abort() a pending or later recv fails at once with the reason.
  auto pending = groups[1]->recv(ops::empty({4}, kFloat32, Device::meta()), 0, 9);
  fake.abort("rank 0 failed");
  EXPECT_THAT(error_of([&] { pending->wait(); }), HasSubstr("rank 0 failed"));
}

TEST(FakeProcessGroup, BadWorldsNameTheRank) {
  EXPECT_THAT(error_of([] {
                FakeProcessGroup::create_world(2, {0, 2});
              }),
              HasSubstr("traced rank 2 is not in a world of 2 ranks"));
  EXPECT_THAT(error_of([] {
                FakeProcessGroup::create_world(2, {1, 1});
              }),
              HasSubstr("rank 1 is traced twice"));
}

}  // namespace
}  // namespace loom::comm
