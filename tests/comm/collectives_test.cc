// Every collective of ProcessGroupGloo × every dtype × world sizes 1-4, even and uneven sizes,
// checked against values each rank computes locally (every rank knows every rank's input).
// Inputs are small integers, so results are exact; averages are rounded exactly as the backend
// rounds them (f32 accumulation, one rounding to the dtype).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <tuple>

#include "comm/gloo/process_group_gloo.h"
#include "comm/testing/multi_rank.h"
#include "tensor/memory_stats.h"
#include "tests/comm/comm_test_util.h"
#include "tests/testing/tensor_checks.h"

namespace loom::comm {
namespace {

using loom::testing::expect_equal;
using loom::testing::rounded_to;
using test::all_reduce_ops;
using test::input_value;
using test::make_tensor;
using test::reduce_expected;
using testing::MultiRankOptions;
using testing::run_on_ranks;

// Element i of rank `src`'s message for rank `dst` in the data-movement tests.
double message_value(int src, int dst, int64_t i) { return src * 100 + dst * 10 + (i % 10); }

// Rank r contributes 3r+1 elements to uneven collectives.
int64_t uneven(int rank) { return 3 * rank + 1; }

// How the group's collectives travel: TCP only, shared memory (ranks are threads of one host),
// and shared memory with 8 bytes per rank and round, so every collective takes many rounds and
// uneven sizes end mid-round.
enum class Transport { kTcp, kSharedMemory, kSharedMemorySmallRounds };

MultiRankOptions over(Transport transport) {
  MultiRankOptions options;
  options.gloo.shared_memory = transport != Transport::kTcp;
  if (transport == Transport::kSharedMemorySmallRounds) options.gloo.shared_memory_slot_bytes = 8;
  return options;
}

const char* transport_name(Transport transport) {
  switch (transport) {
    case Transport::kTcp:
      return "tcp";
    case Transport::kSharedMemory:
      return "shm";
    case Transport::kSharedMemorySmallRounds:
      return "shm_small_rounds";
  }
  return "?";
}

constexpr Transport kTransports[] = {Transport::kTcp, Transport::kSharedMemory,
                                     Transport::kSharedMemorySmallRounds};

class CollectivesTest : public ::testing::TestWithParam<std::tuple<int, DType, Transport>> {
 protected:
  int world() const { return std::get<0>(GetParam()); }
  DType dtype() const { return std::get<1>(GetParam()); }
  MultiRankOptions options() const { return over(std::get<2>(GetParam())); }
};

TEST_P(CollectivesTest, AllReduceEveryOpEvenAndUneven) {
  const DType dtype = this->dtype();
  run_on_ranks(
      world(),
      [dtype](ProcessGroup& pg) {
        const int world = pg.size();
        // 0 elements, fewer elements than ranks, and an uneven split (world*3+1).
        for (int64_t n : {int64_t{0}, int64_t{2}, int64_t{world * 3 + 1}}) {
          int64_t slot = 0;
          for (ReduceOp op : all_reduce_ops()) {
            ++slot;
            Tensor t = make_tensor(dtype, n,
                                   [&](int64_t i) { return input_value(op, pg.rank(), slot, i); });
            pg.all_reduce(t, op)->wait();
            std::vector<double> expected(n);
            for (int64_t i = 0; i < n; ++i) {
              std::vector<double> per_rank;
              for (int r = 0; r < world; ++r) per_rank.push_back(input_value(op, r, slot, i));
              expected[i] = reduce_expected(dtype, op, per_rank);
            }
            expect_equal(
                {.actual = t,
                 .expected = rounded_to(t.dtype(), expected),
                 .what = fmt::format("all_reduce {} of {} elements", reduce_op_name(op), n)});
          }
        }
      },
      options());
}

TEST_P(CollectivesTest, BroadcastFromEveryRoot) {
  const DType dtype = this->dtype();
  run_on_ranks(
      world(),
      [dtype](ProcessGroup& pg) {
        for (int root = 0; root < pg.size(); ++root) {
          Tensor t =
              make_tensor(dtype, 7, [&](int64_t i) { return message_value(pg.rank(), 0, i); });
          pg.broadcast(t, root)->wait();
          std::vector<double> expected(7);
          for (int64_t i = 0; i < 7; ++i) expected[i] = message_value(root, 0, i);
          expect_equal({.actual = t,
                        .expected = rounded_to(t.dtype(), expected),
                        .what = fmt::format("broadcast from {}", root)});
        }
      },
      options());
}

TEST_P(CollectivesTest, AllGatherUnevenAndIntoTensor) {
  const DType dtype = this->dtype();
  run_on_ranks(
      world(),
      [dtype](ProcessGroup& pg) {
        const int world = pg.size();
        Tensor input = make_tensor(dtype, uneven(pg.rank()),
                                   [&](int64_t i) { return message_value(pg.rank(), 0, i); });
        std::vector<Tensor> outputs;
        for (int r = 0; r < world; ++r) outputs.push_back(ops::zeros({uneven(r)}, dtype));
        pg.all_gather(outputs, input)->wait();
        for (int r = 0; r < world; ++r) {
          std::vector<double> expected(uneven(r));
          for (int64_t i = 0; i < uneven(r); ++i) expected[i] = message_value(r, 0, i);
          expect_equal({.actual = outputs[r],
                        .expected = rounded_to(outputs[r].dtype(), expected),
                        .what = fmt::format("all_gather piece of rank {}", r)});
        }
        // Even: one output tensor of world * 5 elements.
        Tensor piece =
            make_tensor(dtype, 5, [&](int64_t i) { return message_value(pg.rank(), 1, i); });
        Tensor gathered = ops::zeros({world * 5}, dtype);
        pg.all_gather_into_tensor(gathered, piece)->wait();
        std::vector<double> expected;
        for (int r = 0; r < world; ++r) {
          for (int64_t i = 0; i < 5; ++i) expected.push_back(message_value(r, 1, i));
        }
        expect_equal({.actual = gathered,
                      .expected = rounded_to(gathered.dtype(), expected),
                      .what = "all_gather_into_tensor"});
      },
      options());
}

TEST_P(CollectivesTest, ReduceScatterUnevenAndEvenEveryOp) {
  const DType dtype = this->dtype();
  run_on_ranks(
      world(),
      [dtype](ProcessGroup& pg) {
        const int world = pg.size();
        const int me = pg.rank();
        int64_t slot = 0;
        for (ReduceOp op : all_reduce_ops()) {
          ++slot;
          // Uneven: rank j's output has 3j+1 elements; inputs[j] is this rank's part of it, and
          // element i of it is input_value(op, rank, slot * 10 + j, i).
          std::vector<Tensor> inputs;
          for (int j = 0; j < world; ++j) {
            inputs.push_back(make_tensor(dtype, uneven(j), [&](int64_t i) {
              return input_value(op, me, slot * 10 + j, i);
            }));
          }
          Tensor output = ops::zeros({uneven(me)}, dtype);
          pg.reduce_scatter(output, inputs, op)->wait();
          std::vector<double> expected(uneven(me));
          for (int64_t i = 0; i < uneven(me); ++i) {
            std::vector<double> per_rank;
            for (int r = 0; r < world; ++r)
              per_rank.push_back(input_value(op, r, slot * 10 + me, i));
            expected[i] = reduce_expected(dtype, op, per_rank);
          }
          expect_equal({.actual = output,
                        .expected = rounded_to(output.dtype(), expected),
                        .what = fmt::format("reduce_scatter {} (uneven)", reduce_op_name(op))});

          // Even: a (world * 4) input, chunk j goes to rank j.
          Tensor input = make_tensor(dtype, world * 4,
                                     [&](int64_t i) { return input_value(op, me, slot + 50, i); });
          Tensor chunk = ops::zeros({4}, dtype);
          pg.reduce_scatter_tensor(chunk, input, op)->wait();
          std::vector<double> expected_chunk(4);
          for (int64_t i = 0; i < 4; ++i) {
            std::vector<double> per_rank;
            for (int r = 0; r < world; ++r)
              per_rank.push_back(input_value(op, r, slot + 50, me * 4 + i));
            expected_chunk[i] = reduce_expected(dtype, op, per_rank);
          }
          expect_equal(
              {.actual = chunk,
               .expected = rounded_to(chunk.dtype(), expected_chunk),
               .what = fmt::format("reduce_scatter_tensor {} (even)", reduce_op_name(op))});
        }
      },
      options());
}

TEST_P(CollectivesTest, AllToAllEvenAndUneven) {
  const DType dtype = this->dtype();
  run_on_ranks(
      world(),
      [dtype](ProcessGroup& pg) {
        const int world = pg.size();
        const int me = pg.rank();
        // Message sizes from src to dst: even = 2; uneven = (src + 2 dst) % 4, some of them empty.
        for (bool even : {true, false}) {
          auto size = [&](int src, int dst) -> int64_t { return even ? 2 : (src + 2 * dst) % 4; };
          std::vector<Tensor> inputs;
          std::vector<Tensor> outputs;
          for (int j = 0; j < world; ++j) {
            inputs.push_back(make_tensor(dtype, size(me, j),
                                         [&](int64_t i) { return message_value(me, j, i); }));
            outputs.push_back(ops::zeros({size(j, me)}, dtype));
          }
          pg.all_to_all(outputs, inputs)->wait();
          for (int j = 0; j < world; ++j) {
            std::vector<double> expected(size(j, me));
            for (int64_t i = 0; i < size(j, me); ++i) expected[i] = message_value(j, me, i);
            expect_equal(
                {.actual = outputs[j],
                 .expected = rounded_to(outputs[j].dtype(), expected),
                 .what = fmt::format("all_to_all ({}) from rank {}", even ? "even" : "uneven", j)});
          }
        }
      },
      options());
}

TEST_P(CollectivesTest, GatherAndScatterUnevenEveryRoot) {
  const DType dtype = this->dtype();
  run_on_ranks(
      world(),
      [dtype](ProcessGroup& pg) {
        const int world = pg.size();
        const int me = pg.rank();
        for (int root = 0; root < world; ++root) {
          Tensor input =
              make_tensor(dtype, uneven(me), [&](int64_t i) { return message_value(me, root, i); });
          std::vector<Tensor> outputs;
          if (me == root) {
            for (int r = 0; r < world; ++r) outputs.push_back(ops::zeros({uneven(r)}, dtype));
          }
          pg.gather(outputs, input, root)->wait();
          for (int r = 0; r < static_cast<int>(outputs.size()); ++r) {
            std::vector<double> expected(uneven(r));
            for (int64_t i = 0; i < uneven(r); ++i) expected[i] = message_value(r, root, i);
            expect_equal({.actual = outputs[r],
                          .expected = rounded_to(outputs[r].dtype(), expected),
                          .what = fmt::format("gather to {} from {}", root, r)});
          }

          std::vector<Tensor> pieces;
          if (me == root) {
            for (int r = 0; r < world; ++r) {
              pieces.push_back(make_tensor(dtype, uneven(r),
                                           [&](int64_t i) { return message_value(root, r, i); }));
            }
          }
          Tensor output = ops::zeros({uneven(me)}, dtype);
          pg.scatter(output, pieces, root)->wait();
          std::vector<double> expected(uneven(me));
          for (int64_t i = 0; i < uneven(me); ++i) expected[i] = message_value(root, me, i);
          expect_equal({.actual = output,
                        .expected = rounded_to(output.dtype(), expected),
                        .what = fmt::format("scatter from {}", root)});
        }
        pg.barrier()->wait();
      },
      options());
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<int, DType, Transport>>& info) {
  return fmt::format("world{}_{}_{}", std::get<0>(info.param), dtype_name(std::get<1>(info.param)),
                     transport_name(std::get<2>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(WorldsDtypesTransports, CollectivesTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::ValuesIn(test::all_dtypes()),
                                            ::testing::ValuesIn(kTransports)),
                         case_name);

// Large enough that messages span many socket buffers, with chunk sizes that do not divide.
TEST(CollectivesLargeTest, AllReduceAndAllToAllOfMegabytes) {
  for (Transport transport : {Transport::kTcp, Transport::kSharedMemory}) {
    SCOPED_TRACE(transport_name(transport));
    run_on_ranks(
        4,
        [](ProcessGroup& pg) {
          const int64_t n = (int64_t{1} << 20) + 3;
          Tensor t = make_tensor(kFloat32, n, [&](int64_t i) { return (i % 1000) + pg.rank(); });
          pg.all_reduce(t)->wait();
          const std::vector<double> got = ops::to_vector(t);
          int64_t wrong = 0;
          for (int64_t i = 0; i < n; ++i) wrong += got[i] != 4.0 * (i % 1000) + 6.0;
          EXPECT_EQ(wrong, 0);

          std::vector<Tensor> inputs;
          std::vector<Tensor> outputs;
          for (int j = 0; j < pg.size(); ++j) {
            inputs.push_back(ops::full({300000 + j}, pg.rank() * 10 + j, kInt32));
            outputs.push_back(ops::zeros({300000 + pg.rank()}, kInt32));
          }
          pg.all_to_all(outputs, inputs)->wait();
          for (int j = 0; j < pg.size(); ++j) {
            const std::vector<double> piece = ops::to_vector(outputs[j]);
            EXPECT_EQ(piece.front(), j * 10 + pg.rank());
            EXPECT_EQ(piece.back(), j * 10 + pg.rank());
          }
        },
        over(transport));
  }
}

// Chunks of several MiB go in segments (reduced while later ones travel): uneven chunks and
// segments on 3 ranks, every element checked, for sum and max.
TEST(CollectivesLargeTest, AllReduceInSegments) {
  for (Transport transport : {Transport::kTcp, Transport::kSharedMemory}) {
    SCOPED_TRACE(transport_name(transport));
    run_on_ranks(
        3,
        [](ProcessGroup& pg) {
          const int64_t n = 6 * (int64_t{1} << 20) + 5;  // 8 MiB chunks: 8 segments each
          Tensor sum = make_tensor(kFloat32, n, [&](int64_t i) { return (i % 977) + pg.rank(); });
          Tensor max =
              make_tensor(kFloat32, n, [&](int64_t i) { return ((i + pg.rank()) % 3) * i % 5; });
          pg.all_reduce(sum)->wait();
          pg.all_reduce(max, ReduceOp::kMax)->wait();
          const std::vector<double> got_sum = ops::to_vector(sum), got_max = ops::to_vector(max);
          int64_t wrong_sum = 0, wrong_max = 0;
          for (int64_t i = 0; i < n; ++i) {
            wrong_sum += got_sum[i] != 3.0 * (i % 977) + 3.0;
            double expected = 0;
            for (int r = 0; r < 3; ++r)
              expected = std::max<double>(expected, ((i + r) % 3) * i % 5);
            wrong_max += got_max[i] != expected;
          }
          EXPECT_EQ(wrong_sum, 0) << "rank " << pg.rank();
          EXPECT_EQ(wrong_max, 0) << "rank " << pg.rank();
        },
        over(transport));
  }
}

// all_gather_into_tensor whose input is this rank's chunk of the output, and
// reduce_scatter_tensor whose output is this rank's chunk of the input (PyTorch allows both).
TEST(CollectivesInPlaceTest, ChunkViewsOfTheOtherBuffer) {
  for (Transport transport : kTransports) {
    SCOPED_TRACE(transport_name(transport));
    run_on_ranks(
        3,
        [](ProcessGroup& pg) {
          const int me = pg.rank();
          Tensor gathered = ops::zeros({3 * 4});
          Tensor mine = ops::narrow(gathered, 0, me * 4, 4);
          ops::fill_(mine, me + 1);
          pg.all_gather_into_tensor(gathered, mine)->wait();
          expect_equal(
              {.actual = gathered,
               .expected = rounded_to(gathered.dtype(), {1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3}),
               .what = "in-place all_gather_into_tensor"});

          Tensor input = make_tensor(kFloat32, 3 * 2, [&](int64_t i) { return me * 100 + i; });
          Tensor chunk = ops::narrow(input, 0, me * 2, 2);
          pg.reduce_scatter_tensor(chunk, input)->wait();
          const double base = 0 + 100 + 200;
          expect_equal({.actual = chunk,
                        .expected = rounded_to(chunk.dtype(),
                                               {base + 3 * (me * 2), base + 3 * (me * 2 + 1)}),
                        .what = "in-place reduce_scatter_tensor"});
        },
        over(transport));
  }
}

// bf16 reductions accumulate in f32 and round once. Rank 0 holds 1.0, the others 3 * 2^-10,
// below half an ulp of 1.0 in bf16 (2^-8): per-step bf16 rounding would drop each addition and
// return 1.0; one rounding of the f32 sum 1 + 9 * 2^-10 gives 1 + 2^-7.
TEST(CollectivesPrecisionTest, Bf16SumRoundsOnce) {
  for (Transport transport : kTransports) {
    SCOPED_TRACE(transport_name(transport));
    run_on_ranks(
        4,
        [](ProcessGroup& pg) {
          const double tiny = 3.0 / 1024.0;
          Tensor t =
              make_tensor(kBFloat16, 1, [&](int64_t) { return pg.rank() == 0 ? 1.0 : tiny; });
          pg.all_reduce(t)->wait();
          EXPECT_EQ(ops::to_vector(t)[0], 1.0078125);
        },
        over(transport));
  }
}

// A collective lets go of its tensors before its work completes: once wait() returns, dropping
// the caller's handles frees the buffers (the communication thread keeping them a moment longer
// let FSDP hold a finished reduce-scatter's whole-size input into the next unit's backward).
TEST(CollectivesMemoryTest, BuffersAreFreedOnceWaitReturns) {
  run_on_ranks(2, [](ProcessGroup& pg) {
    MemoryTracker tracker;
    for (int round = 0; round < 50; ++round) {
      {
        ScopedMemoryTracker scope(tracker);
        Tensor input = ops::full({2, 1024}, 1.0 + pg.rank(), kFloat32);
        Tensor output = ops::empty({1024}, kFloat32);
        pg.reduce_scatter_tensor(output, input)->wait();
        pg.all_reduce(output)->wait();
      }
      ASSERT_EQ(tracker.stats().current_bytes, 0) << "rank " << pg.rank() << " round " << round;
    }
  });
}

}  // namespace
}  // namespace loom::comm
