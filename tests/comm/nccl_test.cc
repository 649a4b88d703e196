// The NCCL backend. Everywhere: dtype/op mappings, error text, and that creating a group without a
// usable GPU throws naming the reason before touching the store. On a GPU: a world-size-1 group
// runs every operation and the results are compared with host values; with two or more GPUs, two
// ranks (threads, one GPU each) check real cross-rank values, point-to-point and the watchdog's
// timeout. GPU cases GTEST_SKIP() with loom::cuda::unavailable_reason() elsewhere.
#include <cuda_runtime_api.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "comm/nccl/nccl_utils.h"
#include "comm/nccl/process_group_nccl.h"
#include "comm/store.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/ops_copy.h"
#include "tensor/ops_create.h"
#include "tests/tensor/cuda_skip.h"

namespace loom::comm {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// A minimal thread-safe Store for ranks that are threads of this process (the shared
// InMemoryStore may not exist yet; this test needs only set/get/wait/check).
class LocalStore final : public Store {
 public:
  void set(const std::string& key, const Bytes& value) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      values_[key] = value;
    }
    cv_.notify_all();
  }
  Bytes get(const std::string& key) override {
    wait({key}, timeout());
    std::lock_guard<std::mutex> lock(mutex_);
    return values_.at(key);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    std::lock_guard<std::mutex> lock(mutex_);
    int64_t value = 0;
    if (auto it = values_.find(key); it != values_.end())
      value = std::stoll(std::string(it->second.begin(), it->second.end()));
    value += delta;
    const std::string text = std::to_string(value);
    values_[key] = Bytes(text.begin(), text.end());
    cv_.notify_all();
    return value;
  }
  bool check(const std::vector<std::string>& keys) override {
    std::lock_guard<std::mutex> lock(mutex_);
    return has_all(keys);
  }
  void wait(const std::vector<std::string>& keys, Duration timeout) override {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, timeout, [&] { return has_all(keys); })) {
      throw Error("LocalStore: timed out waiting for a key");
    }
  }
  bool delete_key(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mutex_);
    return values_.erase(key) > 0;
  }
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = values_.find(key);
    if (holds_expected(it == values_.end() ? nullptr : &it->second, expected)) {
      it = values_.insert_or_assign(key, desired).first;
      cv_.notify_all();
    }
    return it == values_.end() ? Bytes() : it->second;
  }
  using Store::set;
  using Store::wait;

 private:
  bool has_all(const std::vector<std::string>& keys) const {
    for (const auto& key : keys) {
      if (!values_.contains(key)) return false;
    }
    return true;
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::string, Bytes> values_;
};

template <typename Fn>
std::string error_message(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected loom::Error, nothing was thrown";
  return "";
}

ProcessGroupOptions options_named(std::string name, Duration timeout = std::chrono::seconds(60)) {
  ProcessGroupOptions options;
  options.name = std::move(name);
  options.timeout = timeout;
  return options;
}

// ---- everywhere -------------------------------------------------------------------------------

TEST(NcclMappingTest, EveryLoomDtypeHasItsNcclType) {
  EXPECT_EQ(nccl::to_nccl_dtype(kFloat32), ncclFloat32);
  EXPECT_EQ(nccl::to_nccl_dtype(kBFloat16), ncclBfloat16);
  EXPECT_EQ(nccl::to_nccl_dtype(kFloat16), ncclFloat16);
  EXPECT_EQ(nccl::to_nccl_dtype(kInt32), ncclInt32);
  EXPECT_EQ(nccl::to_nccl_dtype(kInt64), ncclInt64);
}

TEST(NcclMappingTest, EveryReduceOpMapsForEveryDtype) {
  for (DType dtype : {kFloat32, kBFloat16, kFloat16, kInt32, kInt64}) {
    EXPECT_EQ(nccl::to_nccl_reduce_op(ReduceOp::kSum, dtype), ncclSum);
    EXPECT_EQ(nccl::to_nccl_reduce_op(ReduceOp::kAvg, dtype), ncclAvg);  // integers truncate
    EXPECT_EQ(nccl::to_nccl_reduce_op(ReduceOp::kMax, dtype), ncclMax);
    EXPECT_EQ(nccl::to_nccl_reduce_op(ReduceOp::kMin, dtype), ncclMin);
    EXPECT_EQ(nccl::to_nccl_reduce_op(ReduceOp::kProduct, dtype), ncclProd);
  }
}

TEST(NcclMappingTest, UnknownDtypeAndOpAreRejectedByName) {
  EXPECT_THAT(error_message([] { nccl::to_nccl_dtype(static_cast<DType>(42)); }),
              AllOf(HasSubstr("has no NCCL type"), HasSubstr("value 42")));
  EXPECT_THAT(error_message([] { nccl::to_nccl_reduce_op(static_cast<ReduceOp>(9), kInt32); }),
              AllOf(HasSubstr("reduce op 9 on i32 is not supported"), HasSubstr("use sum, avg")));
}

TEST(NcclErrorTest, MessageNamesTheOpDeviceCallAndNcclError) {
  const std::string message =
      nccl::nccl_error_message("all_reduce #3 (sum, f32, 8 elements) on group 'tp' (rank 1 of 2)",
                               1, "ncclAllReduce", ncclInvalidArgument, nullptr);
  EXPECT_THAT(
      message,
      AllOf(StartsWith("all_reduce #3 (sum, f32, 8 elements) on group 'tp' (rank 1 of 2) on "
                       "cuda:1: NCCL call ncclAllReduce failed: ncclInvalidArgument ("),
            HasSubstr(ncclGetErrorString(ncclInvalidArgument)), HasSubstr("NCCL's last error: ")));
  EXPECT_EQ(nccl::nccl_result_name(ncclRemoteError), "ncclRemoteError");
  EXPECT_EQ(nccl::nccl_result_name(static_cast<ncclResult_t>(77)), "ncclResult(77)");
  EXPECT_THAT(
      nccl::cuda_error_message("barrier #0 () on group 'g' (rank 0 of 1)", 0, "cudaEventQuery",
                               cudaErrorInvalidValue),
      HasSubstr(
          "on cuda:0: CUDA call cudaEventQuery failed: cudaErrorInvalidValue (invalid argument)"));
}

TEST(ProcessGroupNcclTest, CreateOnAMissingDeviceNamesItAndTheReasonBeforeTheRendezvous) {
  // One past the last device: cuda:0 on a machine without a GPU.
  const int missing = cuda::device_count();
  auto store = std::make_shared<LocalStore>();
  const std::string message = error_message(
      [&] { ProcessGroupNccl::create(store, 0, 1, options_named("nccl-test"), missing); });
  EXPECT_THAT(message, HasSubstr("ProcessGroupNccl::create for group 'nccl-test' (rank 0 of 1)"));
  if (!cuda::available()) {
    // e.g. "... on cuda:0: CUDA is unavailable: no usable CUDA driver: cudaGetDeviceCount
    // returned cudaErrorInsufficientDriver (...)"
    EXPECT_THAT(message, AllOf(HasSubstr("on cuda:0: CUDA is unavailable: "),
                               HasSubstr(cuda::unavailable_reason())));
  } else {
    EXPECT_THAT(message,
                HasSubstr(fmt::format("there is no CUDA device cuda:{}; this process sees {}",
                                      missing, missing)));
  }
  // It failed before publishing a unique id: no peer can join a half-made group.
  EXPECT_FALSE(store->check({nccl::NcclComm::kUniqueIdKey}));
}

TEST(ProcessGroupNcclTest, CreateRejectsABadRankOrDevice) {
  auto store = std::make_shared<LocalStore>();
  EXPECT_THAT(error_message([&] { ProcessGroupNccl::create(store, 2, 2, options_named("g"), 0); }),
              HasSubstr("ProcessGroupNccl::create for group 'g': rank 2 is not in [0, 2)"));
  EXPECT_THAT(error_message([&] { ProcessGroupNccl::create(store, 0, 1, options_named("g"), -1); }),
              HasSubstr("cuda:-1"));
}

// ---- on a GPU: one rank -----------------------------------------------------------------------

Tensor on_gpu(const std::vector<float>& values, DType dtype, int device) {
  return ops::to(ops::from_vector(values, {static_cast<int64_t>(values.size())}, dtype),
                 Device::cuda(device));
}

std::vector<double> on_host(const Tensor& t) { return ops::to_vector(ops::to(t, Device::cpu())); }

class SingleRankTest : public ::testing::Test {
 protected:
  void SetUp() override {
    LOOM_SKIP_WITHOUT_CUDA();
    group_ =
        ProcessGroupNccl::create(std::make_shared<LocalStore>(), 0, 1, options_named("solo"), 0);
  }
  std::shared_ptr<ProcessGroupNccl> group_;
};

TEST_F(SingleRankTest, AllReduceKeepsValuesInEveryDtypeAndOp) {
  const std::vector<float> values = {1, -2, 3.5f, 40, 0, -7};
  for (DType dtype : {kFloat32, kBFloat16, kFloat16, kInt32, kInt64}) {
    for (ReduceOp op :
         {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kProduct}) {
      Tensor t = on_gpu(values, dtype, 0);
      const std::vector<double> expected = on_host(t);  // already rounded to dtype
      group_->all_reduce(t, op)->wait();
      EXPECT_EQ(on_host(t), expected) << dtype_name(dtype) << " " << reduce_op_name(op);
    }
  }
  EXPECT_EQ(group_->backend_name(), "nccl");
  EXPECT_EQ(group_->counters().calls_of(CollectiveKind::kAllReduce), 25);
}

TEST_F(SingleRankTest, GatherScatterFamilyCopiesTheOwnPiece) {
  const std::vector<float> values = {1, 2, 3, 4, 5};
  Tensor input = on_gpu(values, kFloat32, 0);
  Tensor gathered = ops::zeros({5}, kFloat32, Device::cuda(0));
  group_->all_gather_into_tensor(gathered, input)->wait();
  EXPECT_EQ(on_host(gathered), std::vector<double>(values.begin(), values.end()));

  Tensor scattered = ops::zeros({5}, kFloat32, Device::cuda(0));
  group_->reduce_scatter_tensor(scattered, input)->wait();
  EXPECT_EQ(on_host(scattered), on_host(input));

  Tensor b = on_gpu({9, 8}, kInt64, 0);
  group_->broadcast(b, 0)->wait();
  EXPECT_EQ(on_host(b), (std::vector<double>{9, 8}));

  Tensor a2a_out = ops::zeros({5}, kFloat32, Device::cuda(0));
  group_->all_to_all({a2a_out}, {input})->wait();
  EXPECT_EQ(on_host(a2a_out), on_host(input));

  Tensor g_out = ops::zeros({5}, kFloat32, Device::cuda(0));
  group_->gather({g_out}, input, 0)->wait();
  EXPECT_EQ(on_host(g_out), on_host(input));

  Tensor s_out = ops::zeros({5}, kFloat32, Device::cuda(0));
  group_->scatter(s_out, {input}, 0)->wait();
  EXPECT_EQ(on_host(s_out), on_host(input));

  auto barrier = group_->barrier();
  barrier->wait();
  EXPECT_TRUE(barrier->is_completed());
  EXPECT_EQ(barrier->exception(), nullptr);
}

TEST_F(SingleRankTest, ATensorOnAnotherDeviceIsRejectedNamingBoth) {
  Tensor cpu = ops::ones({4});
  EXPECT_THAT(
      error_message([&] { group_->all_reduce(cpu); }),
      HasSubstr("all_reduce on group 'solo': the tensor is on cpu but this nccl group works on "
                "cuda:0; move it there first"));
  EXPECT_TRUE(group_->failure().empty());  // an argument error does not poison the group
  Tensor t = on_gpu({1}, kFloat32, 0);
  group_->all_reduce(t)->wait();
}

TEST_F(SingleRankTest, NewGroupAndAWorkThatOutlivesItsGroup) {
  auto sub = group_->new_group({0}, options_named("sub"));
  ASSERT_NE(sub, nullptr);
  Tensor t = on_gpu({3, 4}, kFloat32, 0);
  auto work = sub->all_reduce(t, ReduceOp::kMax);
  sub.reset();
  work->wait();
  EXPECT_EQ(on_host(t), (std::vector<double>{3, 4}));
}

// Blocks the caller's (legacy default) stream with a host function until released, so the NCCL
// op queued behind it cannot finish and the watchdog's timeout fires.
struct StreamBlocker {
  std::atomic<bool> released{false};
  static void CUDART_CB hold(void* self) {
    auto* blocker = static_cast<StreamBlocker*>(self);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!blocker->released.load() && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
};

TEST_F(SingleRankTest, TimeoutAbortsAndPoisonsTheGroup) {
  Tensor t = on_gpu({1, 2, 3}, kFloat32, 0);  // copies before the stream is blocked
  group_->set_timeout(std::chrono::milliseconds(300));
  StreamBlocker blocker;
  {
    cuda::DeviceGuard on_device(0);
    LOOM_CUDA_CHECK(cudaLaunchHostFunc(cudaStreamLegacy, &StreamBlocker::hold, &blocker));
  }
  // Release the stream once the group failed, whoever detects it (ncclCommAbort may wait for it).
  std::thread releaser([&] {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (group_->failure().empty() && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    blocker.released = true;
  });
  auto work = group_->all_reduce(t);
  const std::string message = error_message([&] { work->wait(); });
  releaser.join();
  // Sequence numbers are the front end's; the description names them ("all_reduce #<n> (...)").
  EXPECT_THAT(message,
              AllOf(StartsWith("all_reduce #"),
                    HasSubstr("(sum, f32, 3 elements) on group 'solo' (rank 0 of 1) on cuda:0: "
                              "timed out: not complete after 300 ms"),
                    HasSubstr("aborted")));
  EXPECT_THAT(group_->failure(), HasSubstr("timed out"));
  EXPECT_THAT(error_message([&] { group_->all_reduce(t); }),
              AllOf(StartsWith("all_reduce #"), HasSubstr("unusable since an earlier failure"),
                    HasSubstr("timed out: not complete after 300 ms")));
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
}

// ---- on two GPUs: two ranks as threads ---------------------------------------------------------

// Runs fn(rank, group) on `world` threads, rank r on cuda:r, over one store.
void run_ranks(int world, Duration timeout,
               const std::function<void(int, const std::shared_ptr<ProcessGroupNccl>&)>& fn) {
  auto store = std::make_shared<LocalStore>();
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto group = ProcessGroupNccl::create(store, r, world, options_named("pair", timeout), r);
        fn(r, group);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    if (!errors[r]) continue;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << ": " << e.what();
    }
  }
}

TEST(TwoRankTest, CollectivesMatchHostValues) {
  LOOM_SKIP_WITHOUT_GPUS(2);
  run_ranks(2, std::chrono::seconds(60), [](int rank, const std::shared_ptr<ProcessGroupNccl>& g) {
    // all_reduce: sum, avg on i64 (truncates toward zero), max.
    Tensor s = on_gpu({1.0f + rank, 10.0f * rank, -3}, kFloat32, rank);
    g->all_reduce(s)->wait();
    EXPECT_EQ(on_host(s), (std::vector<double>{3, 10, -6}));
    Tensor avg = on_gpu({static_cast<float>(rank == 0 ? 1 : 2), -3.0f - rank}, kInt64, rank);
    g->all_reduce(avg, ReduceOp::kAvg)->wait();
    EXPECT_EQ(on_host(avg), (std::vector<double>{1, -3}));  // 3/2 -> 1, -7/2 -> -3
    Tensor mx = on_gpu({static_cast<float>(rank), static_cast<float>(-rank)}, kBFloat16, rank);
    g->all_reduce(mx, ReduceOp::kMax)->wait();
    EXPECT_EQ(on_host(mx), (std::vector<double>{1, 0}));

    // broadcast from rank 1.
    Tensor b = on_gpu({static_cast<float>(rank * 5), 7}, kFloat16, rank);
    g->broadcast(b, 1)->wait();
    EXPECT_EQ(on_host(b), (std::vector<double>{5, 7}));

    // all_gather: equal (one ncclAllGather) and uneven (grouped broadcasts), sizes 3 and 4.
    Tensor in = on_gpu({100.0f * rank, 100.0f * rank + 1}, kFloat32, rank);
    Tensor out = ops::zeros({4}, kFloat32, Device::cuda(rank));
    g->all_gather_into_tensor(out, in)->wait();
    EXPECT_EQ(on_host(out), (std::vector<double>{0, 1, 100, 101}));
    std::vector<float> mine(3 + rank, static_cast<float>(rank + 1));
    std::vector<Tensor> outs = {ops::zeros({3}, kInt32, Device::cuda(rank)),
                                ops::zeros({4}, kInt32, Device::cuda(rank))};
    g->all_gather(outs, on_gpu(mine, kInt32, rank))->wait();
    EXPECT_EQ(on_host(outs[0]), (std::vector<double>(3, 1)));
    EXPECT_EQ(on_host(outs[1]), (std::vector<double>(4, 2)));

    // reduce_scatter: equal (ncclReduceScatter) and uneven (grouped ncclReduce), sizes 1 and 2.
    Tensor rs_in = on_gpu({1, 2, 3, 4}, kFloat32, rank);
    Tensor rs_out = ops::zeros({2}, kFloat32, Device::cuda(rank));
    g->reduce_scatter_tensor(rs_out, rs_in)->wait();
    EXPECT_EQ(on_host(rs_out),
              rank == 0 ? (std::vector<double>{2, 4}) : (std::vector<double>{6, 8}));
    std::vector<Tensor> rs_inputs = {on_gpu({1.0f + rank}, kFloat32, rank),
                                     on_gpu({2, 3.0f * rank}, kFloat32, rank)};
    Tensor rs_mine = ops::zeros({rank == 0 ? 1 : 2}, kFloat32, Device::cuda(rank));
    g->reduce_scatter(rs_mine, rs_inputs, ReduceOp::kProduct)->wait();
    EXPECT_EQ(on_host(rs_mine), rank == 0 ? (std::vector<double>{2}) : (std::vector<double>{4, 0}));

    // all_to_all, uneven: rank r sends r+1+peer elements to each peer.
    std::vector<Tensor> a2a_in, a2a_out;
    for (int peer = 0; peer < 2; ++peer) {
      a2a_in.push_back(
          on_gpu(std::vector<float>(rank + 1 + peer, 10.0f * rank + peer), kFloat32, rank));
      a2a_out.push_back(ops::zeros({peer + 1 + rank}, kFloat32, Device::cuda(rank)));
    }
    g->all_to_all(a2a_out, a2a_in)->wait();
    for (int peer = 0; peer < 2; ++peer) {
      EXPECT_EQ(on_host(a2a_out[peer]), std::vector<double>(peer + 1 + rank, 10.0 * peer + rank));
    }

    // gather and scatter rooted at 1.
    Tensor gin = on_gpu({static_cast<float>(rank + 1)}, kFloat32, rank);
    std::vector<Tensor> gouts;
    if (rank == 1)
      gouts = {ops::zeros({1}, kFloat32, Device::cuda(1)),
               ops::zeros({1}, kFloat32, Device::cuda(1))};
    g->gather(gouts, gin, 1)->wait();
    if (rank == 1) {
      EXPECT_EQ(on_host(gouts[0]), (std::vector<double>{1}));
      EXPECT_EQ(on_host(gouts[1]), (std::vector<double>{2}));
    }
    Tensor sout = ops::zeros({2}, kFloat32, Device::cuda(rank));
    std::vector<Tensor> sins;
    if (rank == 1) sins = {on_gpu({5, 6}, kFloat32, 1), on_gpu({7, 8}, kFloat32, 1)};
    g->scatter(sout, sins, 1)->wait();
    EXPECT_EQ(on_host(sout), rank == 0 ? (std::vector<double>{5, 6}) : (std::vector<double>{7, 8}));

    // send/recv; tags are rejected.
    Tensor p2p = on_gpu({rank == 0 ? 42.0f : 0.0f}, kFloat32, rank);
    if (rank == 0) {
      EXPECT_THAT(error_message([&] { g->send(p2p, 1, 7); }), HasSubstr("no message tags"));
      g->send(p2p, 1)->wait();
    } else {
      g->recv(p2p, 0)->wait();
      EXPECT_EQ(on_host(p2p), (std::vector<double>{42}));
    }
    g->barrier()->wait();
    EXPECT_TRUE(g->failure().empty());
  });
}

TEST(TwoRankTest, AMissingPeerTimesOutNamingTheOpAndPoisonsTheGroup) {
  LOOM_SKIP_WITHOUT_GPUS(2);
  run_ranks(
      2, std::chrono::milliseconds(1500), [](int rank, const std::shared_ptr<ProcessGroupNccl>& g) {
        if (rank == 1) return;  // never joins the all_reduce
        Tensor t = on_gpu({1, 2}, kFloat32, 0);
        auto work = g->all_reduce(t);
        EXPECT_THAT(
            error_message([&] { work->wait(); }),
            AllOf(StartsWith("all_reduce #"),
                  HasSubstr("(sum, f32, 2 elements) on group 'pair' (rank 0 of 2) on cuda:0: "
                            "timed out: not complete after 1500 ms"),
                  HasSubstr("group 'pair' is unusable")));
        EXPECT_THAT(error_message([&] { g->barrier(); }),
                    AllOf(StartsWith("barrier #"), HasSubstr("unusable since an earlier failure"),
                          HasSubstr("all_reduce #")));
      });
}

}  // namespace
}  // namespace loom::comm
