// The smallest Loom job: every rank contributes (rank + 1) and all-reduces.
//
//   bazel build //tools/loomrun //examples:allreduce
//   bazel-bin/tools/loomrun/loomrun --nproc-per-node 4 -- bazel-bin/examples/allreduce
//
// Each rank prints the sum 1 + 2 + ... + world, and checks it.
#include <fmt/format.h>

#include <cstdio>
#include <exception>

#include "base/error.h"
#include "comm/init.h"
#include "comm/launch_env.h"
#include "tensor/ops.h"

int main() {
  using namespace loom;
  try {
    auto world = comm::init_process_group("gloo");
    Tensor t = ops::full({4}, world->rank() + 1.0);
    world->all_reduce(t, comm::ReduceOp::kSum)->wait();
    const double expected = world->size() * (world->size() + 1) / 2.0;
    const double got = ops::to_vector(t)[0];
    fmt::print("rank {} of {}: all_reduce(sum) = {} (expected {})\n", world->rank(), world->size(),
               got, expected);
    std::fflush(stdout);
    return got == expected ? 0 : 1;
  } catch (const std::exception& error) {  // loom::Error, and anything else: never terminate
    fmt::print(stderr, "allreduce: {}\n", error.what());
    return comm::exit_status_for(error);  // 3 when another rank's failure ended this one
  }
}
