// send/recv on ProcessGroupGloo: tags, order, out-of-order matching, size checks.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "base/error.h"
#include "comm/testing/multi_rank.h"
#include "tests/comm/comm_test_util.h"
#include "tests/testing/tensor_checks.h"

namespace loom::comm {
namespace {

using loom::testing::expect_equal;
using loom::testing::rounded_to;
using test::make_tensor;
using ::testing::HasSubstr;
using testing::run_on_ranks;
using namespace std::chrono_literals;

std::vector<double> filled(int64_t n, double base) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = base + static_cast<double>(i);
  return v;
}

TEST(P2PTest, SendRecvEveryDtype) {
  run_on_ranks(2, [](ProcessGroup& pg) {
    for (DType dtype : test::all_dtypes()) {
      if (pg.rank() == 0) {
        pg.send(make_tensor(dtype, 5, [](int64_t i) { return 10.0 + i; }), 1)->wait();
      } else {
        Tensor t = ops::zeros({5}, dtype);
        pg.recv(t, 0)->wait();
        expect_equal({.actual = t,
                      .expected = rounded_to(t.dtype(), filled(5, 10.0)),
                      .what = fmt::format("recv {}", dtype_name(dtype))});
      }
    }
  });
}

TEST(P2PTest, SameTagMatchesInIssueOrder) {
  run_on_ranks(2, [](ProcessGroup& pg) {
    std::vector<Tensor> tensors;
    std::vector<std::shared_ptr<Work>> works;
    for (int m = 0; m < 4; ++m) {
      if (pg.rank() == 0) {
        tensors.push_back(make_tensor(kFloat32, 3, [m](int64_t i) { return m * 100.0 + i; }));
        works.push_back(pg.send(tensors.back(), 1, /*tag=*/7));
      } else {
        tensors.push_back(ops::zeros({3}));
        works.push_back(pg.recv(tensors.back(), 0, /*tag=*/7));
      }
    }
    for (auto& w : works) w->wait();
    if (pg.rank() == 1) {
      for (int m = 0; m < 4; ++m)
        expect_equal({.actual = tensors[m],
                      .expected = rounded_to(tensors[m].dtype(), filled(3, m * 100.0)),
                      .what = fmt::format("message {}", m)});
    }
  });
}

// Rank 1 posts recv(tag 1) then recv(tag 2) but the sender sends tag 2 first and waits for it
// before sending tag 1: the recvs must complete out of issue order.
TEST(P2PTest, OutOfOrderTagsDoNotBlockEachOther) {
  run_on_ranks(2, [](ProcessGroup& pg) {
    if (pg.rank() == 0) {
      pg.send(make_tensor(kFloat32, 2, [](int64_t i) { return 20.0 + i; }), 1, /*tag=*/2)->wait();
      pg.send(make_tensor(kFloat32, 2, [](int64_t i) { return 10.0 + i; }), 1, /*tag=*/1)->wait();
    } else {
      Tensor one = ops::zeros({2});
      Tensor two = ops::zeros({2});
      auto first = pg.recv(one, 0, /*tag=*/1);
      auto second = pg.recv(two, 0, /*tag=*/2);
      second->wait();
      expect_equal(
          {.actual = two, .expected = rounded_to(two.dtype(), filled(2, 20.0)), .what = "tag 2"});
      first->wait();
      expect_equal(
          {.actual = one, .expected = rounded_to(one.dtype(), filled(2, 10.0)), .what = "tag 1"});
    }
  });
}

TEST(P2PTest, RingExchangeWithCollectivesInBetween) {
  run_on_ranks(4, [](ProcessGroup& pg) {
    const int next = (pg.rank() + 1) % pg.size();
    const int prev = (pg.rank() + pg.size() - 1) % pg.size();
    Tensor out = make_tensor(kInt64, 4, [&](int64_t i) { return pg.rank() * 10.0 + i; });
    Tensor in = ops::zeros({4}, kInt64);
    auto recv = pg.recv(in, prev);
    Tensor sum = ops::ones({1});
    auto reduce = pg.all_reduce(sum);  // collectives and point to point interleave freely
    auto send = pg.send(out, next);
    send->wait();
    recv->wait();
    reduce->wait();
    expect_equal(
        {.actual = in, .expected = rounded_to(in.dtype(), filled(4, prev * 10.0)), .what = "ring"});
    expect_equal({.actual = sum,
                  .expected = rounded_to(sum.dtype(), {4.0}),
                  .what = "all_reduce between p2p"});
    EXPECT_TRUE(send->is_completed());
    EXPECT_TRUE(recv->is_completed());
  });
}

TEST(P2PTest, RecvCompletesOnItsOwnWithoutWait) {
  run_on_ranks(2, [](ProcessGroup& pg) {
    Tensor t = ops::zeros({3});
    if (pg.rank() == 1) {
      auto recv = pg.recv(t, 0);
      EXPECT_FALSE(recv->is_completed());  // rank 0 sends only after the barrier below
      pg.barrier()->wait();
      const auto until = std::chrono::steady_clock::now() + 5s;
      while (!recv->is_completed() && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(1ms);
      EXPECT_TRUE(recv->is_completed());
      expect_equal({.actual = t, .expected = rounded_to(t.dtype(), {1, 1, 1}), .what = "recv"});
    } else {
      pg.barrier()->wait();
      pg.send(ops::ones({3}), 1)->wait();
    }
  });
}

// A recv whose size differs from the send fails on both sides with an error naming both, and
// the process does not abort (Gloo would, without the header check).
TEST(P2PTest, SizeMismatchFailsOnBothSidesNamingBoth) {
  std::mutex mutex;
  std::string sender_error;
  std::string receiver_error;
  run_on_ranks(2, [&](ProcessGroup& pg) {
    try {
      if (pg.rank() == 0) {
        pg.send(ops::ones({8}), 1, /*tag=*/3)->wait();
      } else {
        Tensor t = ops::zeros({4});
        pg.recv(t, 0, /*tag=*/3)->wait();
      }
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      std::lock_guard<std::mutex> lock(mutex);
      (pg.rank() == 0 ? sender_error : receiver_error) = e.what();
    }
  });
  EXPECT_THAT(receiver_error, HasSubstr("recv #0"));
  EXPECT_THAT(receiver_error, HasSubstr("rank 0 sent 8 elements of f32 (32 bytes) with tag 3, but "
                                        "this recv expects 4 elements of "
                                        "f32 (16 bytes)"));
  EXPECT_THAT(sender_error, HasSubstr("send #0"));
  EXPECT_THAT(sender_error, HasSubstr("rank 1"));
  EXPECT_THAT(sender_error, HasSubstr("size mismatch"));
}

TEST(P2PTest, DtypeMismatchIsNamed) {
  std::string receiver_error;
  run_on_ranks(2, [&](ProcessGroup& pg) {
    try {
      if (pg.rank() == 0) {
        pg.send(ops::ones({4}, kInt32), 1)->wait();
      } else {
        Tensor t = ops::zeros({4});
        pg.recv(t, 0)->wait();
      }
    } catch (const Error& e) {
      if (pg.rank() == 1) receiver_error = e.what();
    }
  });
  EXPECT_THAT(receiver_error, HasSubstr("rank 0 sent 4 elements of i32"));
  EXPECT_THAT(receiver_error, HasSubstr("expects 4 elements of f32"));
}

}  // namespace
}  // namespace loom::comm
