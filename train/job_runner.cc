#include "train/job_runner.h"

#include <fmt/ranges.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>

#include "base/error.h"
#include "base/profiler.h"
#include "checkpoint/distributed_checkpoint.h"
#include "checkpoint/sha256.h"
#include "comm/init.h"
#include "comm/launch_env.h"
#include "comm/peer_failure.h"
#include "comm/tcp_store.h"
#include "models/hf/token_settings.h"
#include "optim/lr_schedule.h"
#include "parallel/ft/replica_group.h"
#include "tensor/cuda/caching_allocator.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/memory_stats.h"
#include "tensor/ops.h"
#include "train/checkpoint_fields.h"
#include "train/fault_injection.h"
#include "train/job_paths.h"
#include "train/launch.h"
#include "train/loss_plot.h"
#include "train/metrics_history.h"
#include "train/output_files.h"
#include "train/progress_bar.h"
#include "train/router_stats.h"
#include "train/sample.h"

namespace loom::train {

namespace {

// Warmup over the first 5% of the steps, then cosine decay to 10% of the peak (nanoGPT's).
optim::WarmupCosine lr_schedule(const JobConfig& job) {
  const int steps = static_cast<int>(job.steps);
  return {.peak_lr = job.lr,
          .warmup_steps = std::min(std::max(1, steps / 20), steps - 1),
          .total_steps = steps,
          .min_ratio = 0.1};
}

// The device's peak: the caching allocator's on a GPU, the process's resident set on CPU.
// (The step's tensor peak, what `loom plan` predicts, is the process tracker's: tensor bytes.)
int64_t peak_memory_bytes(Device device) {
  if (device.is_cuda())
    return static_cast<int64_t>(cuda::allocator_stats(device.index).peak_allocated_bytes);
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

// The process's resident set now, in bytes: all of it, and the part that is pages of mapped
// files (the binary, its libraries and any mapped token shards) — /proc/self/status's VmRSS and
// RssFile; 0 where there is no such file.
std::pair<int64_t, int64_t> resident_now() {
  std::ifstream status("/proc/self/status");
  int64_t total = 0, file = 0;
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) total = std::stoll(line.substr(6)) * 1024;
    if (line.rfind("RssFile:", 0) == 0) file = std::stoll(line.substr(8)) * 1024;
  }
  return {total, file};
}

}  // namespace

Device resolve_device(const std::string& flag) {
  // The launcher's variables (torchrun/loomrun, mpirun or srun), as init_process_group reads them.
  const comm::LaunchEnv env = comm::read_launch_env();
  const int local_rank = env.local_rank, local_ranks = env.local_world_size;
  const int gpus = cuda::available() ? cuda::device_count() : 0;
  if (flag == "cpu" || (flag == "auto" && gpus < local_ranks)) return Device::cpu();
  LOOM_CHECK(cuda::available(), "--device cuda: {}", cuda::unavailable_reason());
  return Device::cuda(local_rank % gpus);  // ranks beyond the GPUs share them (see the header)
}

namespace {

// Whether this node's ranks outnumber its GPUs, so that some share one.
bool ranks_share_gpus() {
  const comm::LaunchEnv env = comm::read_launch_env();
  return env.local_world_size > cuda::device_count();
}

}  // namespace

namespace {

// What replicas of one job must share, as text a refused replica prints beside the running ones'
// (the items that differ: "; "-separated): the model, the layout (microbatches included) and the
// run's settings, its step count with them (the learning rate's schedule; the data by its
// SHA-256, not its path: replicas on other machines may keep it elsewhere).
std::string replica_job_settings(const nlohmann::json& model, const nlohmann::json& run,
                                 const std::string& layout, int64_t grad_accum) {
  std::vector<std::string> items = {
      fmt::format("seed {}", run.at("seed").dump()),
      fmt::format("batch {} x {}", run.at("batch_size").dump(), run.at("seq_len").dump()),
      fmt::format("{} steps", run.at("steps").dump()),
      layout,
      fmt::format("grad_accum {}", grad_accum),
      fmt::format("data sha256 {:.12}", run.at("data").at("sha256").get<std::string>())};
  // Every other setting by its path, so that a refusal names the one that differs.
  nlohmann::json rest = run;
  for (const char* key : {"seed", "batch_size", "seq_len", "steps"}) rest.erase(key);
  rest["data"].erase("path");
  rest["data"].erase("sha256");
  // Kept: items() refers to it (a temporary's would dangle in the loop).
  const nlohmann::json flat = nlohmann::json{{"model", model}, {"run", rest}}.flatten();
  for (const auto& [path, value] : flat.items()) {
    items.push_back(fmt::format("{} {}", path, value.dump()));
  }
  return fmt::format("{}", fmt::join(items, "; "));
}

// Which launch a replica job is: a number every rank draws, the largest of them (the same on all
// its ranks; another for every launch, a restart's included). Collective over `world`.
uint64_t replica_instance(comm::ProcessGroup& world) {
  // Halved to fit an i64 (the reduction's dtype), and still never 0.
  const int64_t mine = static_cast<int64_t>(parallel::ft::random_instance() >> 1) + 1;
  const Tensor t = ops::from_vector_i64({mine}, {1}, world.device());
  world.all_reduce(t, comm::ReduceOp::kMax)->wait();
  return static_cast<uint64_t>(ops::to(t, Device::cpu()).data<int64_t>()[0]);
}

}  // namespace

// --replicas: this rank's place among the replica jobs (the ranks with its rank in the others),
// over the shared quorum store. None without replicas.
std::shared_ptr<parallel::ft::ReplicaGroup> replica_group(const JobConfig& job,
                                                          const CheckedJob& checked,
                                                          const DeviceMesh& mesh,
                                                          comm::ProcessGroup& world) {
  if (job.replicas <= 1 || !job.replica_replay.empty()) return nullptr;  // a replay is one job
  // --replica and --replica-store were checked with the job (check_job: check_replicas).
  LOOM_CHECK(world.device().is_cpu(),
             "--replicas: fault tolerance across replicas runs on CPU ranks (Gloo), "
             "not on {}",
             world.device().str());
  const HostPort address = parse_host_port(job.replica_store, "--replica-store");
  // The job's collective timeout bounds reaching the store too (an unreachable one fails as a
  // silent peer does, not after the store's own 5 minutes).
  auto store = std::make_shared<comm::TcpStore>(address.host, address.port,
                                                comm::TcpStoreOptions{.timeout = world.timeout()});
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return std::make_shared<parallel::ft::ReplicaGroup>(
      store, static_cast<int>(job.replica), static_cast<int>(job.replicas),
      parallel::ft::ReplicaGroupOptions{
          .local_key = fmt::format("rank{}", world.rank()),
          .join_window = std::chrono::milliseconds(job.replica_join_window_ms),
          .timeout = world.timeout(),
          .instance = replica_instance(world),
          .description = fmt::format("pid {} on {}", ::getpid(), host),
          .job = replica_job_settings(checked.model.args->fields(), checked.run, mesh.str(),
                                      job.grad_accum),
          .job_rank = world.rank()});
}

namespace {

// What a resume whose latest step fails to load can do instead: the committed step before it.
std::string resume_fallback_hint(const std::string& root, const std::string& step_dir) {
  std::vector<int64_t> steps;
  try {
    steps = checkpoint::committed_steps(root);
  } catch (const Error&) {
    return "";
  }
  if (steps.size() < 2) return "";
  return fmt::format(
      "; to resume from the step before it, move '{}' out of '{}' (the latest committed step is "
      "then step {})",
      step_dir, root, steps[steps.size() - 2]);
}

}  // namespace

std::shared_ptr<comm::ProcessGroup> init_job_process_group(const JobConfig& job) {
  comm::InitOptions init;
  if (job.collective_timeout_s > 0) {
    init.timeout = std::chrono::duration_cast<comm::Duration>(
        std::chrono::duration<double>(job.collective_timeout_s));
  }
  const Device device = resolve_device(job.device);
  if (device.is_cuda() && ranks_share_gpus()) {
    // NCCL cannot put two ranks on one GPU: Gloo over the GPU's tensors, staged through host
    // memory (comm/gloo/host_staging.h).
    init.gloo_device = device;
    return comm::init_process_group("gloo", init);
  }
  return comm::init_process_group(device.is_cuda() ? "nccl" : "gloo", init);
}

// Rank 0's outputs: the metrics file, the progress bar, the losses for the plot.
struct JobRunner::Outputs {
  explicit Outputs(bool progress) : bar(progress) {}
  LineWriter metrics;
  ProgressBar bar;
  std::unique_ptr<checkpoint::AsyncSaver> async_saver;
  std::vector<double> losses;
  LossCurve curve;
  double last_loss = 0;
  double data_ms = 0;  // reading this step's batch (before the step: not in its ms)
  double entropy = 0;  // the training data's unigram entropy (rank 0)
};

JobRunner::JobRunner(const JobConfig& job, std::shared_ptr<comm::ProcessGroup> world,
                     std::string program, std::optional<CheckedJob> checked)
    : job_(job), program_(std::move(program)), world_(std::move(world)) {
  LOOM_CHECK(world_ != nullptr, "JobRunner: the world group is null");
  // The degrees against this world (--dp-shard -1 takes what the others leave of it), and the
  // device its groups work on (NCCL: this rank's GPU; Gloo: the CPU, or a GPU ranks share).
  resolve_parallel_degrees(job_, world_->size());
  device_ = world_->device();
  checked_ = checked ? std::move(*checked) : check_job(job_);
  // Rank 0 holds --checkpoint-dir while the job runs: another job saving there is refused.
  if (world_->rank() == 0) checkpoint_lock_ = lock_checkpoint_dir(job_, /*create=*/true);
  // The resident set once the data is open and checked, before the model or any thread of the
  // job's own exists: what the corpus costs a rank (a mapped corpus of any size costs the same).
  const auto [resident_with_data, mapped_with_data] = resident_now();
  const int rank = world_->rank();
  checked_.parallel.validate(world_->size(), job_.batch_size, job_.seq_len);
  // pp outermost, tp innermost (torchtitan's order): tensor-parallel peers are neighbours.
  mesh_ = checked_.parallel.dims.build_mesh(world_);
  const int64_t tensors_before = process_memory_tracker().stats().current_bytes;
  process_memory_tracker().reset_peak();
  model_ = build_parallel_model(*checked_.model.args, static_cast<uint64_t>(job_.seed), mesh_,
                                checked_.parallel);
  // What building the model held at most: this rank's shards when built on the meta device, the
  // whole model (or stage) first when not.
  const int64_t construction_peak = process_memory_tracker().stats().peak_bytes - tensors_before;
  if (rank == 0) {
    fmt::print(
        "{}: model built holding at most {:.1f} MiB of tensors on rank 0 ({}; the whole "
        "model's parameters are {:.1f} MiB)\n",
        program_, static_cast<double>(construction_peak) / 1048576.0,
        job_.meta_init ? "meta-device initialization" : "built whole, then sharded",
        static_cast<double>(checked_.model.args->parameter_count()) * 4 / 1048576.0);
  }
  // Every rank reads the checkpoint and keeps its own shards (no communication).
  if (!job_.init_from.empty()) {
    const models::hf::LoadStats read = model_->load_hf(job_.init_from);
    if (rank == 0) {
      fmt::print(
          "{}: initialized from {} (rank 0 read {:.1f} MiB of the checkpoint's {:.1f} MiB)\n",
          program_, job_.init_from, static_cast<double>(read.bytes_read) / 1048576.0,
          static_cast<double>(read.file_bytes) / 1048576.0);
    }
  }
  trainer_ = std::make_unique<Trainer>(
      *model_, mesh_,
      TrainerOptions{.lr = lr_schedule(job_),
                     .weight_decay = 0.1,
                     .clip = job_.clip,
                     .replicas = replica_group(job_, checked_, *mesh_, *world_),
                     .replica_ranks = world_});
  if (rank == 0) {
    for (const std::string& warning : checked_.warnings) fmt::print("{}: {}\n", program_, warning);
  }
  // --resume: the latest committed checkpoint, saved on any layout.
  if (checked_.resume_from) {
    const std::string& dir = *checked_.resume_from;
    checkpoint::Metadata saved;
    try {
      saved = trainer_->load_checkpoint(dir, *world_);
    } catch (const std::exception& error) {
      // A step found damaged as it loads (a checksum) is damaged on every try: say how to resume
      // from the one before it.
      comm::throw_in_context(error, error.what() + resume_fallback_hint(job_.checkpoint_dir, dir));
    }
    const std::string layout = saved_layout(saved);
    if (rank == 0) {
      const int64_t restarts = restart_count();
      if (restarts > 0) fmt::print("{}: restart {} of the job\n", program_, restarts);
      fmt::print("{}: resumed from {} at step {}{}\n", program_, dir, trainer_->steps_done(),
                 layout == mesh_->str()
                     ? std::string(" (same layout)")
                     : fmt::format(" (saved on {}, now {})", layout, mesh_->str()));
    }
  }
  outputs_ = std::make_unique<Outputs>(rank == 0 && job_.progress);
  // Read once (a corpus's first 16M tokens): the reference the loss lines and plot show.
  if (rank == 0) outputs_->entropy = data::unigram_entropy(checked_.data.train);
  if (rank == 0) {
    // The effective config, once: printed, and written beside the metrics so that
    // `--config <that file>` repeats the run exactly.
    const std::string effective = to_toml(job_);
    if (!job_.metrics_out.empty()) {
      const std::string effective_path = effective_config_path(job_.metrics_out);
      fmt::print("{}: effective config (also in {}):\n{}", program_, effective_path, effective);
      write_file(effective_path, effective, "--metrics-out (the effective config beside it)");
      open_metrics();
    }
    const JobData& data = checked_.data;
    fmt::print("{}: {} params, {} on {}; data {}; unigram entropy {:.3f} nats\n", program_,
               checked_.model.args->parameter_count(), job_.model, mesh_->str(),
               data.train.description(), outputs_->entropy);
    fmt::print("{}: data ready, resident {:.1f} MiB ({:.1f} MiB of it pages of mapped files)\n",
               program_, static_cast<double>(resident_with_data) / 1048576.0,
               static_cast<double>(mapped_with_data) / 1048576.0);
    if (!data.tokenizer_path.empty()) {
      fmt::print("{}: tokenizer {}\n", program_, data.tokenizer->description());
    }
    if (const data::DocumentIndex* documents = data.train.documents()) {
      fmt::print(
          "{}: sequences inside one document: {} documents, {} windows of {} tokens; {} tokens "
          "in documents too short to sample\n",
          program_, documents->documents(), documents->windows(), job_.seq_len + 1,
          documents->skipped_tokens());
    }
    if (data.val) {
      fmt::print("{}: validation on {}: {} batches every {}\n", program_, data.val->description(),
                 data.val_batches,
                 job_.val_every > 0 ? fmt::format("{} steps and after the last", job_.val_every)
                                    : std::string("run, after the last step"));
    }
  }
  add_metrics_hook();
  add_checkpoint_hook();
}

JobRunner::~JobRunner() = default;

// A fresh job truncates --metrics-out. A resumed one keeps the earlier attempts' lines of the
// steps its checkpoint holds (rewritten atomically, so a kill now loses none of them) and goes on
// after them; the loss plot starts from their points. Lines another run wrote are dropped.
void JobRunner::open_metrics() {
  const std::string& path = job_.metrics_out;
  if (!checked_.resume_from) {
    outputs_->metrics = LineWriter(path, "--metrics-out");
    return;
  }
  // (A checkpoint of a Loom that did not record its loss: the lines are kept.)
  MetricsHistory history = read_metrics_before(path, trainer_->steps_done(), checked_.saved_loss);
  if (!history.dropped.empty()) {
    fmt::print(stderr,
               "{}: WARNING: {} holds another run's lines ({}): they are dropped, and the file "
               "starts again at step {}\n",
               program_, path, history.dropped, trainer_->steps_done());
  }
  std::string kept;
  for (const std::string& line : history.lines) kept += line + "\n";
  write_file(path, kept, "--metrics-out");
  outputs_->metrics = LineWriter(path, "--metrics-out", SyncedFileWriter::Mode::kAppend);
  outputs_->curve = std::move(history.curve);
  if (!history.lines.empty()) {
    fmt::print("{}: {} keeps the {} lines of the steps before {} from the earlier run\n", program_,
               path, history.lines.size(), trainer_->steps_done());
  }
}

void JobRunner::add_metrics_hook() {
  const int rank = world_->rank();
  const char* progress = std::getenv("LOOM_PROGRESS_FILE");
  const std::string progress_file = progress != nullptr ? progress : "";
  trainer_->add_step_hook([this, rank, progress_file](const StepResult& r) {
    Outputs& out = *outputs_;
    out.last_loss = r.loss;
    out.losses.push_back(r.loss);
    out.curve.train.emplace_back(r.step, r.loss);
    const std::optional<RouterSummary>& router = r.router;
    if (rank != 0) return;
    // The launcher's view of progress (loomrun --max-restarts: where a failure repeats).
    if (!progress_file.empty()) std::ofstream(progress_file, std::ios::trunc) << r.step << "\n";
    const double tokens_per_s = job_.batch_size * job_.seq_len / (r.ms / 1000.0);
    // The step's tensor peak (torch.cuda.max_memory_allocated's figure, on any device): what
    // `loom plan`'s "peak in step" predicts.
    const int64_t tensor_peak = process_memory_tracker().stats().peak_bytes;
    if (out.metrics.is_open()) {
      nlohmann::json line{{"step", r.step},
                          {"loss", r.loss},
                          {"lr", r.lr},
                          {"tokens_per_s", tokens_per_s},
                          {"ms_per_step", r.ms},
                          {"data_ms", out.data_ms},
                          {"tensor_peak_bytes", tensor_peak},
                          {"peak_mem_bytes", peak_memory_bytes(device_)},
                          {"rss_bytes", resident_now().first},
                          {"rss_file_bytes", resident_now().second},
                          {"grad_norm", r.grad_norm}};
      if (job_.replicas > 1) {
        line["replicas"] = r.replicas;
        line["replica_members"] = r.replica_members;
      }
      if (router) {
        line["moe_load_max_over_mean"] = router->max_over_mean;
        line["moe_load_min_over_mean"] = router->min_over_mean;
        line["moe_aux_loss"] = router->aux_loss;
        line["moe_dropped"] = router->dropped;
      }
      out.metrics.write_line(line.dump());
    }
    if (r.step % job_.log_every == 0 || r.step + 1 == job_.steps) {
      out.bar.clear();
      fmt::print(
          "step {:5d} | loss {:.4f} | lr {:.2e} | {:8.0f} tok/s | {:7.1f} ms | tensors {:.1f} MiB "
          "peak | {} {:.0f} MiB\n",
          r.step, r.loss, r.lr, tokens_per_s, r.ms, tensor_peak / 1048576.0,
          device_.is_cuda() ? "allocator" : "resident", peak_memory_bytes(device_) / 1048576.0);
      if (device_.is_cuda()) {
        // Counts that stop growing after the first steps say the cache serves every tensor; a
        // count that grows each step means cudaMalloc (which synchronizes) inside the step.
        const cuda::AllocatorStats stats = cuda::allocator_stats(device_.index);
        fmt::print("           allocator: {} cudaMalloc, {} cudaFree, {} cache flushes so far\n",
                   stats.raw_allocations, stats.raw_frees, stats.cache_flushes);
      }
      if (router) {
        fmt::print(
            "           moe: expert load max/mean {:.2f} min/mean {:.2f} | aux loss {:.4g} | "
            "dropped {}\n",
            router->max_over_mean, router->min_over_mean, router->aux_loss, router->dropped);
      }
      std::fflush(stdout);
    }
    out.bar.update(r.step, static_cast<int>(job_.steps), r.loss, tokens_per_s);
  });
}

// Distributed checkpoints: every --checkpoint-every steps and after the last; with
// --async-checkpoint the state is staged to host memory and committed in the background.
void JobRunner::add_checkpoint_hook() {
  if (job_.checkpoint_dir.empty()) return;
  if (job_.async_checkpoint) {
    outputs_->async_saver = std::make_unique<checkpoint::AsyncSaver>(world_);  // collective
  }
  const int rank = world_->rank();
  trainer_->add_step_hook([this, rank](const StepResult& r) {
    const bool last = r.step + 1 == job_.steps;
    if (!last && (job_.checkpoint_every == 0 || (r.step + 1) % job_.checkpoint_every != 0)) return;
    const auto start = std::chrono::steady_clock::now();
    // The metrics line of this step is on disk before the checkpoint that records its loss is
    // committed: a resume after a crash or power loss finds it and keeps the earlier lines
    // (open_metrics), where it would otherwise take them for another run's and drop them.
    if (outputs_->metrics.is_open()) outputs_->metrics.sync();
    const nlohmann::json fields =
        job_checkpoint_fields(checked_.model.args->fields(), *mesh_, checked_.run,
                              checked_.hf_token_settings, SavedLoss{r.step, r.loss});
    const checkpoint::SaveOptions options{.keep_last = static_cast<int>(job_.keep_last)};
    std::string committed;
    checkpoint::AsyncSaver* async_saver = outputs_->async_saver.get();
    if (async_saver) {
      committed = async_saver->wait();  // the previous save, committed in the background
      async_saver->save(trainer_->checkpoint_state(fields), job_.checkpoint_dir,
                        trainer_->steps_done(), options);
    } else {
      committed = trainer_->save_checkpoint(job_.checkpoint_dir, *world_, fields, options);
    }
    const double stall_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (rank != 0) return;
    outputs_->bar.clear();
    if (!committed.empty()) fmt::print("{}: checkpoint {} committed\n", program_, committed);
    fmt::print("{}: checkpoint of step {}: training stalled {:.1f} ms{}\n", program_,
               trainer_->steps_done(), stall_ms,
               async_saver ? " (async: staged, committing in the background)" : "");
  });
}

namespace {

// Runs `work`, adding "step N: " to what it throws (a PeerFailure stays one), so that an error
// raised deep in the model (a router's NaN scores, a shape) names the step it stopped. A message
// that already begins so (the trainer's non-finite gradient norm) is left as it is.
template <typename Work>
void naming_step(int step, std::string_view what, Work&& work) {
  try {
    work();
  } catch (const std::exception& error) {
    const std::string prefix = fmt::format("{}step {}: ", what, step);
    if (std::string_view(error.what()).starts_with(prefix)) throw;
    comm::throw_in_context(error, prefix + error.what());
  }
}

}  // namespace

void JobRunner::train_steps(JobResult& result) {
  const int before = trainer_->steps_done();
  // With replicas a joining job learns its first step from the others (Trainer::begin_step).
  result.first_step = trainer_->begin_step();
  if (result.first_step != before && world_->rank() == 0) {
    fmt::print("{}: replica {} joined the running job at step {} with its state\n", program_,
               job_.replica, result.first_step);
  }
  const std::optional<InjectedFault> fault = injected_fault_from_env();
  for (int step = result.first_step; step < job_.steps; step = trainer_->begin_step()) {
    maybe_inject_fault(fault, world_->rank(), step);
    // The op timer skips the first step (allocator, plans and caches warming up).
    if (job_.profile_ops && step == result.first_step + 1) {
      // LOOM_PROFILE may add per-shape rows ("ops,shapes"); a GPU always synchronizes.
      profiler::Options options = profiler::environment_options();
      options.synchronize = options.synchronize || device_.is_cuda();
      profiler::enable(options);
    }
    const auto fetch_start = std::chrono::steady_clock::now();
    if (!checked_.replay_members
             .empty()) {  // --replica-replay: the recorded members' batches, on this job
      const auto members = checked_.replay_members.find(step);
      LOOM_CHECK(members != checked_.replay_members.end(),
                 "--replica-replay {}: no members recorded for step {}", job_.replica_replay, step);
      std::vector<std::pair<Tensor, Tensor>> batches;
      for (int member : members->second) {
        const data::Batch share =
            local_batch(checked_.data.train, job_.seed, step, *mesh_, job_.batch_size, job_.seq_len,
                        checked_.parallel.cp, ReplicaShare{member, job_.replicas});
        batches.emplace_back(share.inputs, share.targets);
      }
      naming_step(step, "", [&] {
        trainer_->replay_step(batches, members->second, static_cast<int>(job_.replicas));
      });
      continue;
    }
    const data::Batch batch =
        local_batch(checked_.data.train, job_.seed, step, *mesh_, job_.batch_size, job_.seq_len,
                    checked_.parallel.cp, ReplicaShare{job_.replica, job_.replicas});
    outputs_->data_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - fetch_start)
            .count();
    process_memory_tracker().reset_peak();  // the step's own peak (its batch included)
    naming_step(step, "", [&] { trainer_->step(batch.inputs, batch.targets); });
    const bool last = step + 1 == job_.steps;
    if (checked_.data.val && (last || (job_.val_every > 0 && (step + 1) % job_.val_every == 0))) {
      naming_step(step, "the validation after ", [&] { validate(step, result); });
    }
  }
  outputs_->bar.clear();
  if (profiler::enabled()) {
    profiler::disable();
    if (world_->rank() == 0) {
      fmt::print(
          "{}: op times on rank 0 over steps {}..{} (self: minus nested ops and "
          "scopes{}):\n{}",
          program_, result.first_step + 1, job_.steps - 1,
          device_.is_cuda() ? "; each op waited for its kernels" : "", profiler::table(40));
    }
  }
}

// The loss on the validation batches (the same ones every time), averaged over every dp rank.
void JobRunner::validate(int step, JobResult& result) {
  const auto start = std::chrono::steady_clock::now();
  const data::TokenCorpus& val = *checked_.data.val;
  const int64_t batches = checked_.data.val_batches;
  double total = 0;
  for (int64_t i = 0; i < batches; ++i) {
    const data::Batch batch =
        validation_batch(val, i, *mesh_, job_.batch_size, job_.seq_len, checked_.parallel.cp);
    total += trainer_->evaluate(batch.inputs, batch.targets);
  }
  const double loss = total / static_cast<double>(batches);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  result.validation.emplace_back(step, loss);
  if (world_->rank() != 0) return;
  outputs_->curve.validation.emplace_back(step, loss);
  if (outputs_->metrics.is_open()) {
    outputs_->metrics.write_line(nlohmann::json{
        {"step", step},
        {"val_loss", loss},
        {"val_tokens", batches * job_.batch_size * job_.seq_len},
        {"val_ms", ms}}.dump());
  }
  outputs_->bar.clear();
  fmt::print("step {:5d} | val loss {:.4f} | {} batches, {:.1f} ms\n", step, loss, batches, ms);
  std::fflush(stdout);
}

void JobRunner::report_tensor_peaks() {
  const int world = world_->size();
  if (world == 1) return;  // the metrics line has it
  const Device device = world_->device();
  const Tensor mine =
      ops::from_vector_i64({process_memory_tracker().stats().peak_bytes}, {1}, device);
  Tensor all = ops::empty({world}, kInt64, device);
  world_->all_gather_into_tensor(all, mine)->wait();
  if (world_->rank() != 0) return;
  const Tensor on_host = ops::to(all, Device::cpu());
  const int64_t* peaks = on_host.data<int64_t>();
  std::string line;
  for (int r = 0; r < world; ++r) {
    line += fmt::format("{}{} {:.1f}", r == 0 ? "" : ", ", r, peaks[r] / 1048576.0);
  }
  // Ranks differ under a pipeline (stages, the schedule's microbatches in flight): `loom plan`'s
  // traced "peak in step" per rank is what this measures.
  fmt::print("{}: tensor peak per rank (MiB): {}\n", program_, line);
}

void JobRunner::finish(JobResult& result) {
  const int rank = world_->rank();
  report_tensor_peaks();
  if (outputs_->async_saver) {
    const std::string committed = outputs_->async_saver->wait();
    if (rank == 0 && !committed.empty()) {
      fmt::print("{}: checkpoint {} committed\n", program_, committed);
    }
  }
  // Every rank gathers (full_tensor over tp, the stages over pp); rank 0 writes.
  if (!job_.save.empty()) {
    model_->save_hf(job_.save, /*write=*/rank == 0);
    const std::string& tokenizer = checked_.data.tokenizer_path;
    if (rank == 0 && !tokenizer.empty()) models::hf::copy_tokenizer_beside(tokenizer, job_.save);
    if (rank == 0) models::hf::write_token_settings(checked_.hf_token_settings, job_.save);
    if (rank == 0) {
      fmt::print("{}: saved {} (Hugging Face safetensors, config.json{} beside it)\n", program_,
                 job_.save, tokenizer.empty() ? "" : " and tokenizer.json");
    }
  }
  // A sample, generated by every rank together, printed by rank 0.
  if (job_.sample_tokens > 0) {
    const auto tokens = generate_sample(*model_, checked_.data.train,
                                        checked_.model.args->vocab_size(), mesh_->device(),
                                        {.tokens = job_.sample_tokens,
                                         .window = job_.seq_len,
                                         .multiple = job_.tp,
                                         .seed = static_cast<uint64_t>(job_.seed)});
    const std::string text =
        sample_text(tokens, checked_.data.train, checked_.data.tokenizer.get());
    if (rank == 0 && !text.empty()) fmt::print("sample:\n{}\n", text);
  }
  result.losses = outputs_->losses;
  result.final_loss = outputs_->last_loss;
  if (rank == 0) {
    outputs_->metrics.close();
    if (outputs_->losses.empty()) {
      // Nothing trained (a resumed run already at --steps): no loss to call final.
      fmt::print("{}: no step to train: the run is at step {} of --steps {}\n", program_,
                 trainer_->steps_done(), job_.steps);
    } else {
      fmt::print("final loss {:.4f}{} (unigram entropy {:.3f}){}\n", result.final_loss,
                 result.validation.empty()
                     ? std::string()
                     : fmt::format(", validation loss {:.4f}", result.validation.back().second),
                 outputs_->entropy,
                 job_.metrics_out.empty() ? "" : fmt::format("; metrics: {}", job_.metrics_out));
    }
    if (!job_.plot_out.empty()) {
      fmt::print("{}\n",
                 write_loss_plot(outputs_->curve, outputs_->entropy, job_.plot_out, program_));
    }
  }
  // Rank 0 serves the store every group reports to: it leaves last, after every rank is done.
  world_->barrier()->wait();
}

JobResult JobRunner::run() {
  JobResult result;
  train_steps(result);
  finish(result);
  return result;
}

}  // namespace loom::train
