// Your own training job over the library (train/job_runner.h): the settings in code, then the
// same runner `./loom train` runs, with checkpoints every 10 steps and resume switched on.
//
//   bazel build //tools/loomrun //examples:my_job
//   bazel-bin/tools/loomrun/loomrun --nproc-per-node 4 -- bazel-bin/examples/my_job ckpt
//
// It trains the tiny GPT: on an even count of ranks with tp = 2 (sequence parallel) and dp over
// the rest (4 ranks: dp = 2), on an odd count with dp over all of them. dp must divide the batch
// of 8 sequences, so it runs on 1, 2, 4, 8 or 16 ranks; on any other count (3, 6, ...) it exits
// naming the batch. Run it again with the same folder: it resumes where it stopped.
#include <fmt/format.h>

#include <exception>

#include "comm/init.h"
#include "comm/launch_env.h"
#include "train/job_runner.h"

int main(int argc, char** argv) {
  using namespace loom;
  try {
    auto world = comm::init_process_group("gloo");
    train::JobConfig job;  // tiny GPT on the GPL-3 text
    job.tp = world->size() % 2 == 0 ? 2 : 1;
    job.dp_replicate = world->size() / job.tp;
    job.steps = 30, job.batch_size = 8, job.seq_len = 32;
    job.checkpoint_dir = argc > 1 ? argv[1] : "my_job_checkpoints";
    job.checkpoint_every = 10, job.resume = true;
    job.metrics_out = job.plot_out = "", job.sample_tokens = 0;  // no output files
    train::JobRunner runner(job, world, "my_job");
    const train::JobResult result = runner.run();
    if (world->rank() == 0 && !result.losses.empty()) {
      fmt::print("{}: steps {}..{}, loss {:.4f} -> {:.4f}\n", runner.checked().parallel.dims.str(),
                 result.first_step, job.steps - 1, result.losses.front(), result.final_loss);
    }
    return 0;
  } catch (const std::exception& error) {  // loom::Error, and anything else: never terminate
    fmt::print(stderr, "my_job: {}\n", error.what());
    return comm::exit_status_for(error);  // 3 when another rank's failure ended this one
  }
}
