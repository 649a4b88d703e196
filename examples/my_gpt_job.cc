// Your own training job in a few lines: the mesh, the parallel config, the model, and the
// library's composition and step driver (train/), the same code ./loom train runs.
//
//   bazel build //tools/loomrun //examples:my_gpt_job
//   bazel-bin/tools/loomrun/loomrun --nproc-per-node 4 -- bazel-bin/examples/my_gpt_job
//
// On 4 ranks it trains the tiny GPT with tp = 2 (sequence parallel) and dp = 2; on any other
// count, dp over all of them. Exits 1 unless the loss fell.
#include <fmt/format.h>

#include <cstdio>
#include <exception>

#include "base/error.h"
#include "comm/init.h"
#include "models/data/token_data.h"
#include "models/gpt/config.h"
#include "optim/lr_schedule.h"
#include "train/parallel_gpt.h"
#include "train/trainer.h"

int main() {
  using namespace loom;
  try {
    auto world = comm::init_process_group("gloo");
    const int64_t tp = world->size() % 2 == 0 ? 2 : 1;
    const train::ParallelConfig parallel{.dims = {.dp_replicate = world->size() / tp, .tp = tp}};
    const int64_t batch = 8, seq_len = 32, steps = 30;
    parallel.validate(world->size(), batch, seq_len);
    const auto mesh = parallel.dims.build_mesh(world);

    const data::TokenData text = data::load_tokens("/usr/share/common-licenses/GPL-3");
    models::GPTConfig config = models::GPTConfig::preset("tiny");
    config.vocab_size = text.vocab_size;
    const auto model = train::build_parallel_gpt(config, /*seed=*/1, mesh, parallel);
    train::Trainer trainer(
        *model, mesh,
        {.lr = optim::WarmupCosine{.peak_lr = 3e-3, .warmup_steps = 3, .total_steps = steps}});

    double first = 0, last = 0;
    for (int step = 0; step < steps; ++step) {
      const data::Batch b = train::local_batch(text, /*seed=*/2, step, *mesh, batch, seq_len);
      const train::StepResult r = trainer.step(b.inputs, b.targets);
      (step == 0 ? first : last) = r.loss;
      if (world->rank() == 0 && step % 10 == 0) fmt::print("step {} loss {:.4f}\n", step, r.loss);
    }
    if (world->rank() == 0) {
      fmt::print("{} on {}: loss {:.4f} -> {:.4f}\n", parallel.dims.str(), mesh->str(), first,
                 last);
      std::fflush(stdout);
    }
    world->barrier()->wait();
    return last < first ? 0 : 1;
  } catch (const std::exception& error) {  // loom::Error, and anything else: never terminate
    fmt::print(stderr, "my_gpt_job: {}\n", error.what());
    return 1;
  }
}
