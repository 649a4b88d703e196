// A Gloo group whose tensors live on a GPU (GlooOptions::device, comm/gloo/host_staging.h): the
// way several ranks sharing one GPU communicate, since they cannot form an NCCL communicator.
// Every operation on cuda:0 tensors, with 3 thread ranks sharing that GPU, gives the CPU group's
// results bit for bit: the same ops run once on a CPU group and once on a CUDA group, and each
// rank's results are compared element for element. Skips with the reason without a GPU; the
// device checks run everywhere.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/in_memory_store.h"
#include "comm/testing/multi_rank.h"
#include "tensor/ops.h"
#include "tests/tensor/cuda_skip.h"

namespace loom::comm {
namespace {

using ::testing::HasSubstr;

// rank r's values for op `op`: distinct per rank, op and element, exact in bf16 and f32.
Tensor values(int64_t n, int rank, int op, DType dtype, Device device) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(op * 64 + rank * 8 + i) * 0.5f;
  return ops::to(ops::from_vector(v, {n}, dtype), device);
}

std::vector<double> host(const Tensor& t) { return ops::to_vector(ops::to(t, Device::cpu())); }

// Every operation of the group, each result read back (from the GPU when there).
std::vector<std::vector<double>> run_every_op(ProcessGroup& pg) {
  const Device device = pg.device();
  const int rank = pg.rank(), world = pg.size();
  std::vector<std::vector<double>> out;

  for (DType dtype : {kFloat32, kBFloat16}) {
    Tensor t = values(5, rank, 0, dtype, device);
    pg.all_reduce(t, ReduceOp::kSum)->wait();
    out.push_back(host(t));
    Tensor a = values(4, rank, 1, dtype, device);
    pg.all_reduce(a, ReduceOp::kAvg)->wait();
    out.push_back(host(a));
  }
  Tensor b = values(6, rank, 2, kFloat32, device);
  pg.broadcast(b, 1)->wait();
  out.push_back(host(b));

  // Uneven all_gather: rank r gives r + 1 elements.
  std::vector<Tensor> gathered;
  for (int r = 0; r < world; ++r) gathered.push_back(ops::empty({r + 1}, kFloat32, device));
  pg.all_gather(gathered, values(rank + 1, rank, 3, kFloat32, device))->wait();
  for (const Tensor& g : gathered) out.push_back(host(g));

  // Into one tensor: the pieces are views of one GPU buffer.
  Tensor together = ops::empty({world * 3}, kFloat32, device);
  pg.all_gather_into_tensor(together, values(3, rank, 4, kFloat32, device))->wait();
  out.push_back(host(together));

  // Uneven reduce_scatter: rank j's share has j + 2 elements.
  std::vector<Tensor> shares;
  for (int j = 0; j < world; ++j) shares.push_back(values(j + 2, rank, 5 + j, kFloat32, device));
  Tensor mine = ops::empty({rank + 2}, kFloat32, device);
  pg.reduce_scatter(mine, shares, ReduceOp::kSum)->wait();
  out.push_back(host(mine));

  Tensor chunk = ops::empty({2}, kFloat32, device);
  pg.reduce_scatter_tensor(chunk, values(world * 2, rank, 9, kFloat32, device))->wait();
  out.push_back(host(chunk));

  // all_to_all: rank r sends rank j (r + j + 1) elements.
  std::vector<Tensor> to_send, received;
  for (int j = 0; j < world; ++j) {
    to_send.push_back(values(rank + j + 1, rank, 10 + j, kFloat32, device));
    received.push_back(ops::empty({j + rank + 1}, kFloat32, device));
  }
  pg.all_to_all(received, to_send)->wait();
  for (const Tensor& r : received) out.push_back(host(r));

  // gather to rank 0, scatter from the last rank.
  std::vector<Tensor> at_root;
  if (rank == 0) {
    for (int r = 0; r < world; ++r) at_root.push_back(ops::empty({3}, kFloat32, device));
  }
  pg.gather(at_root, values(3, rank, 14, kFloat32, device), 0)->wait();
  for (const Tensor& g : at_root) out.push_back(host(g));
  std::vector<Tensor> from_root;
  if (rank == world - 1) {
    for (int r = 0; r < world; ++r) from_root.push_back(values(2, r, 15, kFloat32, device));
  }
  Tensor scattered = ops::empty({2}, kFloat32, device);
  pg.scatter(scattered, from_root, world - 1)->wait();
  out.push_back(host(scattered));

  // A ring of sends and receives.
  Tensor incoming = ops::empty({7}, kBFloat16, device);
  auto sent = pg.send(values(7, rank, 16, kBFloat16, device), (rank + 1) % world);
  pg.recv(incoming, (rank + world - 1) % world)->wait();
  sent->wait();
  out.push_back(host(incoming));

  pg.barrier()->wait();
  return out;
}

// Each rank's results of run_every_op on a group of `world` ranks with `gloo`'s device.
std::map<int, std::vector<std::vector<double>>> results_on(int world, GlooOptions gloo) {
  std::mutex mutex;
  std::map<int, std::vector<std::vector<double>>> by_rank;
  testing::run_on_ranks(world,
                        [&](ProcessGroup& pg) {
                          auto results = run_every_op(pg);
                          std::lock_guard<std::mutex> lock(mutex);
                          by_rank[pg.rank()] = std::move(results);
                        },
                        {.gloo = gloo});
  return by_rank;
}

TEST(GlooOnCudaTest, EveryOperationOnOneSharedGpuEqualsTheCpuGroupBitForBit) {
  LOOM_SKIP_WITHOUT_CUDA();
  constexpr int kWorld = 3;
  GlooOptions on_gpu = GlooOptions::loopback();
  on_gpu.device = Device::cuda(0);
  const auto expected = results_on(kWorld, GlooOptions::loopback());
  const auto actual = results_on(kWorld, on_gpu);
  ASSERT_EQ(expected.size(), static_cast<size_t>(kWorld));
  ASSERT_EQ(actual.size(), static_cast<size_t>(kWorld));
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(actual.at(r).size(), expected.at(r).size()) << "rank " << r;
    for (size_t i = 0; i < expected.at(r).size(); ++i) {
      EXPECT_EQ(actual.at(r)[i], expected.at(r)[i]) << "rank " << r << ", result " << i;
    }
  }
}

TEST(GlooOnCudaTest, TheGroupAndItsSubgroupsWorkOnTheirDevice) {
  GlooOptions on_gpu = GlooOptions::loopback();
  on_gpu.device = Device::cuda(0);
  testing::run_on_ranks(2,
                        [](ProcessGroup& pg) {
                          EXPECT_EQ(pg.device(), Device::cuda(0));
                          auto sub = pg.new_group({0, 1}, {.name = "sub", .timeout = pg.timeout()});
                          EXPECT_EQ(sub->device(), Device::cuda(0));
                          // A CPU tensor given to a GPU group is refused, naming both devices.
                          Tensor t = ops::zeros({2});
                          try {
                            pg.all_reduce(t);
                            ADD_FAILURE() << "a CPU tensor was accepted by a cuda:0 group";
                          } catch (const Error& e) {
                            EXPECT_THAT(e.what(), HasSubstr("cpu"));
                            EXPECT_THAT(e.what(), HasSubstr("cuda:0"));
                          }
                        },
                        {.gloo = on_gpu});
}

TEST(GlooOnCudaTest, AGroupOnTheMetaDeviceIsRefusedNamingIt) {
  GlooOptions on_meta = GlooOptions::loopback();
  on_meta.device = Device::meta();
  try {
    ProcessGroupGloo::create(std::make_shared<InMemoryStore>(), 0, 1, {.name = "m"}, on_meta);
    ADD_FAILURE() << "a Gloo group on the meta device was created";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("meta"));
    EXPECT_THAT(e.what(), HasSubstr("'m'"));
  }
}

}  // namespace
}  // namespace loom::comm
