// fsdp_memory_bench: per-rank bytes of the training state — parameters + gradients + AdamW's two
// moments — of a GPT fully sharded over dp_shard = 1, 2 and 4 (threads of this process over
// loopback Gloo), after one optimizer step, beside the 1/N of the unsharded state.
//
//   bazel run -c opt //tools/bench:fsdp_memory_bench                   # the small model (124M)
//   bazel run -c opt //tools/bench:fsdp_memory_bench -- --model tiny --shards 1,2,3,4
//
// The bytes are the local shards' (a DTensor's local tensor), counted from the tensors the
// optimizer and the model hold: what ZeRO-3 keeps between steps. The uneven first dims (the
// vocabulary of 50257 over 4 is 12565 x 3 + 12562) make the largest rank's share slightly above
// 1/N; "vs 1/N" is that rank's excess.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <sstream>

#include "autograd/engine.h"
#include "dtensor/dtensor.h"
#include "models/gpt/gpt.h"
#include "optim/optimizer.h"
#include "parallel/fsdp/fully_shard.h"
#include "tensor/host_memory.h"
#include "tensor/ops.h"
#include "tools/bench/gloo_threads.h"

namespace {

using namespace loom;

int64_t local_bytes(const Tensor& t) {
  if (!t.defined()) return 0;
  const Tensor& local = is_dtensor(t) ? local_shard(t) : t;
  return local.numel() * static_cast<int64_t>(element_size(local.dtype()));
}

struct StateBytes {
  int64_t params = 0, grads = 0, moments = 0;
  int64_t total() const { return params + grads + moments; }
};

StateBytes run_rank(comm::ProcessGroup& pg, const models::GPTConfig& config, int64_t seq) {
  auto gpt = std::make_shared<models::GPT>(config, /*seed=*/0);
  if (pg.size() > 1) {
    const auto mesh = std::make_shared<const DeviceMesh>(pg.shared_from_this(),
                                                         std::vector<std::string>{"dp_shard"},
                                                         std::vector<int64_t>{pg.size()});
    for (auto& block : gpt->h) fsdp::fully_shard(*block, mesh);
    fsdp::fully_shard(*gpt, mesh);
  }
  optim::AdamW adamw(gpt->parameters(), {.lr = 1e-4});
  const Tensor ids = ops::zeros({1, seq}, kInt64);
  backward(gpt->loss(ids, ids));
  adamw.step();
  StateBytes bytes;
  for (const Tensor& p : gpt->parameters()) {
    bytes.params += local_bytes(p);
    bytes.grads += local_bytes(p.grad());
  }
  for (const Tensor& m : adamw.state_tensors()) bytes.moments += local_bytes(m);
  return bytes;
}

// Every rank's state bytes on `world` ranks.
std::vector<StateBytes> run(int world, const models::GPTConfig& config, int64_t seq) {
  return bench::run_on_gloo_threads<StateBytes>(
      "fsdp_memory_bench", world, "dp_shard", 300,
      [&](comm::ProcessGroup& pg) { return run_rank(pg, config, seq); });
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

}  // namespace

int main(int argc, char** argv) {
  keep_freed_host_memory();  // as loom_train: tensor/host_memory.h
  CLI::App app{"Per-rank parameters + gradients + AdamW moments under FSDP, beside 1/N"};
  std::string model = "small";
  std::string shards_text = "1,2,4";
  int64_t seq = 8;
  app.add_option("--model", model, "GPT preset")->check(CLI::IsMember({"tiny", "small"}));
  app.add_option("--shards", shards_text, "dp_shard degrees, comma-separated (1 first)");
  app.add_option("--seq", seq, "tokens of the one training sequence")->check(CLI::Range(1, 1024));
  CLI11_PARSE(app, argc, argv);
  std::vector<int> shards;
  std::stringstream list(shards_text);
  for (std::string item; std::getline(list, item, ',');) shards.push_back(std::stoi(item));
  if (shards.empty() || shards.front() != 1) {
    fmt::print(stderr, "fsdp_memory_bench: --shards must start with 1 (the unsharded state)\n");
    return 2;
  }
  const models::GPTConfig config = models::GPTConfig::preset(model);
  fmt::print(
      "fsdp_memory_bench: GPT {} ({} parameters), parameters + gradients + AdamW moments "
      "per rank after one step\n",
      model, config.parameter_count());
  fmt::print("{:>8} | {:>12} {:>12} {:>12} | {:>12} | {:>12} | {:>9}\n", "dp_shard", "params MiB",
             "grads MiB", "moments MiB", "total MiB", "1/N MiB", "vs 1/N");
  int64_t whole = 0;
  for (int n : shards) {
    const std::vector<StateBytes> ranks = run(n, config, seq);
    StateBytes largest = ranks[0];
    for (const StateBytes& r : ranks) {
      if (r.total() > largest.total()) largest = r;
    }
    if (n == 1) whole = largest.total();
    const double ideal = static_cast<double>(whole) / n;
    fmt::print("{:>8} | {:>12.1f} {:>12.1f} {:>12.1f} | {:>12.1f} | {:>12.1f} | {:>+8.3f}%\n", n,
               mib(largest.params), mib(largest.grads), mib(largest.moments), mib(largest.total()),
               ideal / (1 << 20), 100.0 * (static_cast<double>(largest.total()) / ideal - 1.0));
  }
  return 0;
}
