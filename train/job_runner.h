// A training job as a library call (torchtitan's Trainer): what `./loom train` runs, and what a
// user's own program runs with its own settings.
//
//   train::JobConfig job;                       // the defaults: tiny GPT, dp 2 x tp 2
//   job.checkpoint_dir = "ckpt";                // switch on what the job should do
//   job.resume = true;
//   train::JobRunner runner(job, train::init_job_process_group(job));
//   runner.run();
//
// Setup (the constructor, on every rank): the checks every job makes (train/job_checks.h), the
// mesh (ParallelDims), the model of any registered family (build_parallel_model; the program
// links the families it trains: //models:families, //models:gpt_family, ...), --init-from,
// the Trainer, --resume (any layout), and rank 0's outputs: the effective config, the metrics
// (JSONL), the printed step lines and the progress bar, and checkpoints every N steps (async or
// not). run() trains to job.steps, then writes --save, prints a sample and the final loss, and
// draws the loss curve. An empty metrics_out or plot_out writes none.
//
// Collective contract: the constructor and run() are collective over the world (every rank
// calls them); rank 0 serves the store, so run() ends with a barrier.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/file_lock.h"
#include "comm/process_group.h"
#include "mesh/device_mesh.h"
#include "train/job_checks.h"
#include "train/job_config.h"
#include "train/parallel_model.h"
#include "train/trainer.h"

namespace loom::train {

// --device auto|cpu|cuda -> this rank's device: cuda:LOCAL_RANK when every rank on this node
// gets its own GPU. With --device cuda and more ranks than GPUs, ranks share them
// (cuda:LOCAL_RANK % GPUs) and the job's groups are Gloo's, staged through host memory (NCCL
// cannot put two ranks on one GPU): slower, for checking multi-rank layouts on one GPU. Each node
// decides from its own ranks and GPUs, so every node of a job must have the same ranks per GPU.
// auto
// picks cuda only when every rank gets its own GPU, else cpu.
Device resolve_device(const std::string& flag);

// The world group of the job's ranks (the launcher's environment): NCCL for GPU ranks, Gloo for
// CPU ranks and for ranks sharing a GPU (staged), with the job's collective timeout.
std::shared_ptr<comm::ProcessGroup> init_job_process_group(const JobConfig& job);

struct JobResult {
  int first_step = 0;                              // 0, or the step resumed from
  std::vector<double> losses;                      // of the steps this run trained
  std::vector<std::pair<int, double>> validation;  // (step, validation loss), every rank
  double final_loss = 0;
};

class JobRunner {
 public:
  // `program` names the job in its printed lines ("loom_train"). `checked`: the job's checks
  // already run on this process against this world (check_job after resolve_parallel_degrees),
  // which the runner then takes instead of running them again.
  JobRunner(const JobConfig& job, std::shared_ptr<comm::ProcessGroup> world,
            std::string program = "loom_train", std::optional<CheckedJob> checked = std::nullopt);
  ~JobRunner();
  JobRunner(const JobRunner&) = delete;
  JobRunner& operator=(const JobRunner&) = delete;

  // Trains the remaining steps, then --save, the sample, the final line and the plot.
  JobResult run();

  // The pieces, for a program that drives its own loop.
  const JobConfig& job() const { return job_; }
  const CheckedJob& checked() const { return checked_; }
  const std::shared_ptr<const DeviceMesh>& mesh() const { return mesh_; }
  ParallelModel& model() { return *model_; }
  Trainer& trainer() { return *trainer_; }
  int rank() const { return world_->rank(); }

 private:
  struct Outputs;
  // Rank 0: --metrics-out, continued after the checkpoint's steps when the job resumed.
  void open_metrics();
  void add_metrics_hook();
  void add_checkpoint_hook();
  void train_steps(JobResult& result);
  void finish(JobResult& result);
  // Every rank's tensor peak (collective over the world), printed by rank 0.
  void report_tensor_peaks();
  // --val-data: the loss on the validation batches after step `step`, printed and recorded.
  void validate(int step, JobResult& result);

  JobConfig job_;
  std::string program_;
  std::shared_ptr<comm::ProcessGroup> world_;
  Device device_ = Device::cpu();
  FileLock checkpoint_lock_;  // rank 0's, of --checkpoint-dir (train/job_paths.h)
  CheckedJob checked_;
  std::shared_ptr<const DeviceMesh> mesh_;
  std::unique_ptr<ParallelModel> model_;
  std::unique_ptr<Trainer> trainer_;
  std::unique_ptr<Outputs> outputs_;
};

}  // namespace loom::train
