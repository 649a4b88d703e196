// Which transport a Gloo group picks (shared memory when every rank is on one host, TCP
// otherwise), per group and per sub-group, and that both give bit-identical results.
#include <dirent.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/gloo/process_group_gloo.h"
#include "comm/in_memory_store.h"
#include "tensor/ops.h"

namespace loom::comm {
namespace {

using namespace std::chrono_literals;

// Runs body(rank, group) on `world` threads, rank r's group created with options_of(r).
void run_groups(int world, const std::function<GlooOptions(int)>& options_of,
                const std::function<void(int, ProcessGroupGloo&)>& body) {
  auto store = std::make_shared<InMemoryStore>();
  std::vector<std::thread> threads;
  std::vector<std::string> errors(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto group =
            ProcessGroupGloo::create(store, r, world, {.name = "t", .timeout = 10s}, options_of(r));
        body(r, *group);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

GlooOptions on_host(const std::string& host) {
  GlooOptions options = GlooOptions::loopback();
  options.host_identity = host;
  return options;
}

TEST(TransportTest, RanksOfOneHostUseSharedMemoryAndSubGroupsDecideForThemselves) {
  // Ranks 0 and 1 say they run on host a, ranks 2 and 3 on host b.
  run_groups(
      4, [](int r) { return on_host(r < 2 ? "a" : "b"); },
      [](int r, ProcessGroupGloo& world) {
        EXPECT_FALSE(world.uses_shared_memory()) << "two hosts: TCP";
        Tensor t = ops::full({5}, r + 1.0);
        world.all_reduce(t)->wait();
        EXPECT_EQ(ops::to_vector(t), std::vector<double>(5, 10.0));
        auto host_a = world.new_group({0, 1}, {.name = "host_a", .timeout = 10s});
        auto host_b = world.new_group({2, 3}, {.name = "host_b", .timeout = 10s});
        auto across = world.new_group({1, 2}, {.name = "across", .timeout = 10s});
        auto& host_group = dynamic_cast<ProcessGroupGloo&>(r < 2 ? *host_a : *host_b);
        EXPECT_TRUE(host_group.uses_shared_memory()) << "a sub-group within one host";
        Tensor h = ops::full({3}, r + 1.0);
        host_group.all_reduce(h)->wait();
        EXPECT_EQ(ops::to_vector(h), std::vector<double>(3, r < 2 ? 3.0 : 7.0));
        if (across) {
          EXPECT_FALSE(dynamic_cast<ProcessGroupGloo&>(*across).uses_shared_memory());
        }
      });
}

TEST(TransportTest, OneRankTurningSharedMemoryOffKeepsTheGroupOnTcp) {
  run_groups(
      3,
      [](int r) {
        GlooOptions options = GlooOptions::loopback();
        options.shared_memory = r != 2;
        return options;
      },
      [](int, ProcessGroupGloo& group) { EXPECT_FALSE(group.uses_shared_memory()); });
  run_groups(
      3, [](int) { return GlooOptions::loopback(); },
      [](int, ProcessGroupGloo& group) { EXPECT_TRUE(group.uses_shared_memory()); });
}

// LOOM_GLOO_SHM: 0/false/off keep every group on TCP, 1/true/on (or unset) allow shared
// memory; anything else is an error naming it.
TEST(TransportTest, SharedMemoryFromTheEnvironment) {
  for (const char* off : {"0", "false", "off"}) {
    ASSERT_EQ(setenv("LOOM_GLOO_SHM", off, 1), 0);
    EXPECT_FALSE(shared_memory_allowed_by_env()) << off;
    run_groups(
        2, [](int) { return GlooOptions::loopback(); },
        [&](int, ProcessGroupGloo& group) { EXPECT_FALSE(group.uses_shared_memory()) << off; });
  }
  for (const char* on : {"1", "true", "on", ""}) {
    ASSERT_EQ(setenv("LOOM_GLOO_SHM", on, 1), 0);
    EXPECT_TRUE(shared_memory_allowed_by_env()) << on;
  }
  ASSERT_EQ(setenv("LOOM_GLOO_SHM", "no", 1), 0);
  try {
    shared_memory_allowed_by_env();
    ADD_FAILURE() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("LOOM_GLOO_SHM='no': expected 0, false or off"),
              std::string::npos)
        << e.what();
  }
  unsetenv("LOOM_GLOO_SHM");
}

// Random f32 and bf16 data, sum and avg over 3 ranks: shared memory and TCP agree bit for bit
// (each element is reduced from the same pieces in rank order either way).
TEST(TransportTest, SharedMemoryAndTcpResultsAreBitIdentical) {
  const int world = 3;
  const int64_t n = 300001;  // several 1 MiB rounds, shares that do not divide evenly
  auto input = [&](int rank, DType dtype) {
    std::mt19937 gen(1234 + rank);
    std::normal_distribution<float> normal;
    std::vector<float> values(n);
    for (auto& v : values) v = normal(gen);
    return ops::from_vector(values, {n}, dtype);
  };
  for (DType dtype : {kFloat32, kBFloat16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      std::vector<std::vector<Tensor>> results(2, std::vector<Tensor>(world));
      for (int shm = 0; shm < 2; ++shm) {
        run_groups(
            world,
            [&](int) {
              GlooOptions options = GlooOptions::loopback();
              options.shared_memory = shm == 1;
              return options;
            },
            [&](int r, ProcessGroupGloo& group) {
              EXPECT_EQ(group.uses_shared_memory(), shm == 1);
              Tensor t = input(r, dtype);
              group.all_reduce(t, op)->wait();
              results[shm][r] = t;
            });
      }
      for (int r = 0; r < world; ++r) {
        const Tensor& tcp = results[0][r];
        const Tensor& shm = results[1][r];
        EXPECT_EQ(std::memcmp(tcp.raw_data(), shm.raw_data(), n * element_size(dtype)), 0)
            << dtype_name(dtype) << " op " << static_cast<int>(op) << " rank " << r;
      }
    }
  }
}

// Segments are unlinked once every rank has mapped them: none of this process's is left.
TEST(TransportTest, NoSegmentIsLeftInDevShm) {
  run_groups(
      4, [](int) { return GlooOptions::loopback(); },
      [](int, ProcessGroupGloo& group) { EXPECT_TRUE(group.uses_shared_memory()); });
  const std::string prefix = fmt::format("loom-gloo-{}-", ::getpid());
  DIR* dir = ::opendir("/dev/shm");
  ASSERT_NE(dir, nullptr);
  std::vector<std::string> left;
  while (dirent* entry = ::readdir(dir)) {
    if (std::string(entry->d_name).rfind(prefix, 0) == 0) left.push_back(entry->d_name);
  }
  ::closedir(dir);
  EXPECT_TRUE(left.empty()) << left.front();
}

}  // namespace
}  // namespace loom::comm
