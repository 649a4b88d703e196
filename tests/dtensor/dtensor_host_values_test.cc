// A DTensor's values read on the host and its handles: item() and ops::to_vector give the whole
// tensor's values (a shard gathered, a Partial reduced: collective, as torch's item() of a
// DTensor), never a read of the local shard's bytes as if they were the whole; raw_data()/data()
// of a DTensor are refused naming what to call; detach() of a DTensor is a DTensor with its
// placements; and an output of a DTensor op that no gradient reaches (an unused unbind slice)
// gets zeros with its placements, so its op's backward runs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "comm/testing/multi_rank.h"
#include "dtensor/comm_debug_mode.h"
#include "dtensor/dtensor.h"
#include "tests/dtensor/dtensor_test_util.h"
#include "tests/testing/errors.h"
#include "tests/testing/tensor_checks.h"

namespace loom {
namespace {

using comm::ProcessGroup;
using comm::testing::run_on_ranks;
using loom::testing::error_of;
using loom::testing::expect_equal;
using loom::testing::integer_tensor;
using loom::testing::make_mesh;
using ::testing::HasSubstr;

TEST(DTensorHostValues, ToVectorAndItemAreTheWholeTensorsValues) {
  run_on_ranks(2, [](ProcessGroup& pg) {
    auto mesh = make_mesh(pg, {"tp"}, {2});
    const Tensor full = integer_tensor({5, 3}, 1);  // uneven rows: 3 and 2
    const Tensor rows = distribute_tensor(full, mesh, {Shard(0)});
    EXPECT_EQ(ops::to_vector(rows), ops::to_vector(full));
    // One element sharded: rank 1's shard is empty, its value rank 0's.
    const Tensor one = distribute_tensor(ops::full({1}, 5.0), mesh, {Shard(0)});
    EXPECT_EQ(local_shard(one).numel(), pg.rank() == 0 ? 1 : 0);
    EXPECT_EQ(one.item<float>(), 5.0f);
    // A Partial sum: the reduced value on every rank (each holds its part, 2).
    const Tensor parts = from_local(ops::full({}, 2.0), mesh, {Partial()});
    CommDebugMode comm;
    EXPECT_EQ(parts.item<float>(), 4.0f);
    EXPECT_EQ(comm.total_count(), 1);  // one all_reduce
    const Tensor max_parts =
        from_local(ops::full({}, pg.rank() + 1.0), mesh, {Partial(comm::ReduceOp::kMax)});
    EXPECT_EQ(max_parts.item<double>(), 2.0);
    EXPECT_EQ(ops::to_vector(max_parts), std::vector<double>{2.0});
  });
}

TEST(DTensorHostValues, RawDataOfADTensorIsRefused) {
  run_on_ranks(2, [](ProcessGroup& pg) {
    auto mesh = make_mesh(pg, {"tp"}, {2});
    const Tensor rows = distribute_tensor(integer_tensor({64, 3}, 1), mesh, {Shard(0)});
    EXPECT_THAT(error_of([&] { (void)rows.data<float>(); }),
                AllOf(HasSubstr("only its local shard, not the 192 elements"),
                      HasSubstr("to_local"), HasSubstr("full_tensor")));
    EXPECT_THAT(error_of([&] { (void)rows.raw_data(); }), HasSubstr("local shard"));
    // The shard itself reads as before.
    EXPECT_EQ(local_shard(rows).data<float>()[0], ops::to_vector(local_shard(rows))[0]);
  });
}

TEST(DTensorHostValues, DetachOfADTensorIsADTensorWithItsPlacements) {
  run_on_ranks(2, [](ProcessGroup& pg) {
    auto mesh = make_mesh(pg, {"tp"}, {2});
    Tensor d = distribute_tensor(integer_tensor({4, 2}, 1), mesh, {Shard(0)});
    d.set_requires_grad(true);
    const Tensor detached = detach(d);
    ASSERT_TRUE(is_dtensor(detached));
    EXPECT_FALSE(detached.requires_grad());
    EXPECT_EQ(dtensor_spec(detached).placements, dtensor_spec(d).placements);
    EXPECT_TRUE(local_shard(detached).storage() == local_shard(d).storage());  // no copy
    expect_equal({.actual = full_tensor(add(detached, d)),
                  .expected = ops::mul(integer_tensor({4, 2}, 1), 2.0)});
  });
}

// unbind's backward stacks every slice's gradient; an unused slice's zeros are a DTensor's,
// sharded as the slice (before: plain zeros of the global shape, which cat refused beside
// DTensors).
TEST(DTensorHostValues, UnusedUnbindSlicesGetShardedZeros) {
  for (const Placement& placement :
       {Placement(Shard(0)), Placement(Shard(1)), Placement(Replicate())}) {
    SCOPED_TRACE(placement.str());
    run_on_ranks(2, [&](ProcessGroup& pg) {
      auto mesh = make_mesh(pg, {"tp"}, {2});
      const Tensor full = integer_tensor({2, 6}, 1);
      Tensor d = distribute_tensor(full, mesh, {placement});
      d.set_requires_grad(true);
      backward(sum(mul(unbind(d, 0)[1], 3.0)));
      ASSERT_TRUE(is_dtensor(d.grad()));
      const Tensor expected =
          ops::cat(std::vector<Tensor>{ops::zeros({1, 6}), ops::full({1, 6}, 3.0)}, 0);
      expect_equal({.actual = full_tensor(d.grad()), .expected = expected});
    });
  }
}

}  // namespace
}  // namespace loom
