// `./loom train`: train a GPT on CPU ranks with data parallelism (DDP over "dp_replicate", FSDP
// over "dp_shard", HSDP with both), tensor parallelism (Megatron-style over "tp") and pipeline
// parallelism (stages over "pp"), on text that needs no download.
//
//   ./loom train                         # tiny GPT, dp=2 x tp=2 = 4 ranks, GPL-3 text
//   ./loom train --dp 2 --tp 2 --pp 2    # 3-D: 8 ranks, 1F1B over pp = 2 microbatches
//   ./loom train --dp-shard 2 --tp 2     # FSDP x TP: 4 ranks
//   ./loom train --dp-shard -1 --tp 2 --nproc 8   # FSDP over what tp leaves: dp_shard 4
//   ./loom train --dp 1 --tp 1 --steps 50 --data my.txt
//
// Started without a launcher (no RANK in the environment) and with more than one rank, the
// program re-launches itself under loomrun (--launcher), one process per rank. Rank 0 prints
// one line per step (loss, lr, tokens/s, ms/step, peak memory), writes the metrics as JSONL, a
// loss-curve PNG (gnuplot) and a generated sample at the end.
#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numbers>
#include <sstream>

#include "autograd/grad_mode.h"
#include "base/error.h"
#include "base/profiler.h"
#include "checkpoint/distributed_checkpoint.h"
#include "comm/init.h"
#include "comm/launch_env.h"
#include "mesh/device_mesh.h"
#include "models/data/token_data.h"
#include "models/gpt/config.h"
#include "models/gpt/hf.h"
#include "models/llama/config.h"
#include "models/llama/hf.h"
#include "optim/lr_schedule.h"
#include "tensor/cuda/caching_allocator.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/host_memory.h"
#include "tensor/ops.h"
#include "train/checkpoint_fields.h"
#include "train/job_config.h"
#include "train/job_plan.h"
#include "train/output_files.h"
#include "train/parallel_gpt.h"
#include "train/parallel_llama.h"
#include "train/trainer.h"

namespace {

using namespace loom;

// Every setting of the job (train/job_config.h): flags, the --config file and the effective
// config all come from one table of options.
using Flags = train::JobConfig;

// Warmup over the first 5% of the steps, then cosine decay to 10% of the peak (nanoGPT's).
optim::WarmupCosine lr_schedule(const Flags& f) {
  const int steps = static_cast<int>(f.steps);
  return {.peak_lr = f.lr,
          .warmup_steps = std::min(std::max(1, steps / 20), steps - 1),
          .total_steps = steps,
          .min_ratio = 0.1};
}

// A one-line progress bar on the user's terminal. It writes to /dev/tty rather than stdout, so
// it still reaches the terminal when loomrun pipes rank 0's output, and never enters logs or
// pipes (tests, CI: no terminal, no bar).
class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : tty_(enabled ? std::fopen("/dev/tty", "w") : nullptr) {}
  ~ProgressBar() {
    if (tty_) {
      std::fputs("\r\033[K", tty_);
      std::fclose(tty_);
    }
  }
  void update(int step, int steps, double loss, double tokens_per_s) {
    if (!tty_) return;
    constexpr int kWidth = 30;
    const int filled = steps > 0 ? kWidth * (step + 1) / steps : kWidth;
    fmt::print(tty_, "\r\033[K[{}{}] {}/{} loss {:.4f} {:.0f} tok/s", std::string(filled, '#'),
               std::string(kWidth - filled, '.'), step + 1, steps, loss, tokens_per_s);
    std::fflush(tty_);
  }
  // Clears the bar before a regular line is printed.
  void clear() {
    if (tty_) std::fputs("\r\033[K", tty_), std::fflush(tty_);
  }

 private:
  std::FILE* tty_;
};

// The device's peak: the caching allocator's on a GPU, the process's resident set on CPU.
int64_t peak_memory_bytes(Device device) {
  if (device.is_cuda())
    return static_cast<int64_t>(cuda::allocator_stats(device.index).peak_allocated_bytes);
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

// --device auto|cpu|cuda -> this rank's device, cuda:LOCAL_RANK (one GPU per rank). auto picks
// cuda when every rank on this node gets its own GPU, else cpu.
Device resolve_device(const std::string& flag) {
  // The launcher's variables (torchrun/loomrun, mpirun or srun), as init_process_group reads them.
  const comm::LaunchEnv env = comm::read_launch_env();
  const int local_rank = env.local_rank, local_ranks = env.local_world_size;
  const int gpus = cuda::available() ? cuda::device_count() : 0;
  if (flag == "cpu" || (flag == "auto" && gpus < local_ranks)) return Device::cpu();
  LOOM_CHECK(cuda::available(), "train_gpt: --device cuda but {}", cuda::unavailable_reason());
  LOOM_CHECK(local_rank < gpus,
             "train_gpt: --device cuda: local rank {} needs cuda:{} but {} GPU(s) are visible",
             local_rank, local_rank, gpus);
  return Device::cuda(local_rank);
}

// The job's degrees (flags resolved: --dp-shard -1, the default dp).
train::ParallelDims job_dims(const Flags& f) {
  return {.pp = f.pp, .dp_replicate = f.dp_replicate, .dp_shard = f.dp_shard, .tp = f.tp};
}

[[noreturn]] void relaunch(const Flags& f, const std::string& launcher, int argc, char** argv) {
  const int64_t world = job_dims(f).world_size();
  LOOM_CHECK(!launcher.empty(),
             "train_gpt: {} ranks requested ({}) but no launcher: run under loomrun, or pass "
             "--launcher PATH_TO_LOOMRUN (./loom train does)",
             world, job_dims(f).str());
  std::vector<std::string> args{launcher, "--nproc-per-node", std::to_string(world), "--"};
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  args.push_back(n > 0 ? std::string(self, n) : argv[0]);
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  std::vector<char*> c_args;
  for (auto& a : args) c_args.push_back(a.data());
  c_args.push_back(nullptr);
  std::fflush(stdout);
  execv(c_args[0], c_args.data());
  LOOM_FAIL("train_gpt: could not start the launcher '{}': {}", launcher, std::strerror(errno));
}

// The loss curve: its points and gnuplot script beside the PNG, then gnuplot. A point file or
// script that cannot be written is an error; a missing or failing gnuplot leaves the points and
// says so.
void write_plot(const std::vector<double>& losses, double entropy, const std::string& png) {
  const std::string data = png + ".dat", script = png + ".gnuplot";
  std::string points;
  for (size_t step = 0; step < losses.size(); ++step) {
    points += fmt::format("{} {}\n", step, losses[step]);
  }
  train::write_file(data, points, "--plot-out");
  train::write_file(script,
                    fmt::format("set terminal pngcairo size 800,500\nset output '{}'\n"
                                "set xlabel 'step'\nset ylabel 'loss (nats)'\n"
                                "set title 'train_gpt' noenhanced\nset grid\n"
                                "plot '{}' using 1:2 with lines title 'loss', {} with lines "
                                "dashtype 2 title 'unigram entropy of the data'\n",
                                png, data, entropy),
                    "--plot-out");
  const int status = std::system(fmt::format("gnuplot '{}' 2>/dev/null", script).c_str());
  if (status == 0 && std::filesystem::exists(png)) {
    fmt::print("loss curve: {}\n", png);
  } else {
    fmt::print(
        "loss curve: gnuplot failed or is missing (./loom setup installs it); the losses are in "
        "{}\n",
        data);
  }
}

// The path the effective config is written to, beside the metrics: m.jsonl -> m.config.toml.
std::string config_path_beside(const std::string& metrics) {
  const std::filesystem::path path(metrics);
  return (path.parent_path() / (path.stem().string() + ".config.toml")).string();
}

// The model the flags describe: the preset with the sizes given, or, when --init-from has a
// config.json beside it (Hugging Face's save_pretrained), that checkpoint's sizes, which the
// flags given must not contradict. The vocabulary is set from the data in run() unless it comes
// from the checkpoint or --vocab-size. A sequence longer than the context is an error, never a
// silently larger model.
struct ModelChoice {
  models::GPTConfig config;
  // Who fixed config.vocab_size ("--vocab-size", "the checkpoint's config.json"); empty: the
  // vocabulary is the data's (the preset's stands in until run() knows it).
  std::string vocab_from;
};

ModelChoice model_config(const Flags& f) {
  models::GPTConfig config = models::GPTConfig::preset(f.model);
  const std::optional<models::GPTConfig> saved =
      f.init_from.empty() ? std::nullopt : models::read_gpt2_hf_config(f.init_from);
  if (saved) {
    const auto agree = [&](int64_t flag, int64_t value, const char* name, const char* key) {
      LOOM_CHECK(flag == 0 || flag == value,
                 "--{}: {} contradicts the checkpoint '{}', whose config.json has {} = {}; drop "
                 "the flag (the checkpoint's sizes are used) or pick another checkpoint",
                 name, flag, f.init_from, key, value);
    };
    agree(f.n_layer, saved->n_layer, "n-layer", "n_layer");
    agree(f.n_head, saved->n_head, "n-head", "n_head");
    agree(f.n_embd, saved->n_embd, "n-embd", "n_embd");
    agree(f.block_size, saved->block_size, "block-size", "n_positions");
    agree(f.vocab_size, saved->vocab_size, "vocab-size", "vocab_size");
    config = *saved;
  } else {
    if (f.n_layer) config.n_layer = f.n_layer;
    if (f.n_head) config.n_head = f.n_head;
    if (f.n_embd) config.n_embd = f.n_embd;
    if (f.block_size) config.block_size = f.block_size;
    if (f.vocab_size) config.vocab_size = f.vocab_size;
  }
  LOOM_CHECK(f.seq_len <= config.block_size,
             "--seq-len: {} tokens per sequence is more than the model's context of {} ({}); "
             "pass a larger --block-size or a shorter --seq-len",
             f.seq_len, config.block_size,
             saved          ? "n_positions of the checkpoint's config.json"
             : f.block_size ? "--block-size"
                            : "--block-size, the preset's");
  return {config, saved ? "the checkpoint's config.json" : f.vocab_size ? "--vocab-size" : ""};
}

// A Llama preset with the size flags applied (--n-layer, --n-head, --n-embd: dim, --block-size:
// max_seq_len), or, with --init-from, the sizes of the Hugging Face checkpoint's config.json
// (which the size flags given must not contradict).
models::LlamaConfig llama_config(const Flags& f) {
  models::LlamaConfig config = models::LlamaConfig::preset(f.model);
  if (!f.init_from.empty()) {
    const std::string json =
        (std::filesystem::path(f.init_from).parent_path() / "config.json").string();
    LOOM_CHECK(std::filesystem::exists(json),
               "--init-from: a Llama checkpoint needs its config.json beside it (as "
               "save_pretrained writes it), but '{}' does not exist",
               json);
    config = models::read_llama_hf_config(json);
    const auto agree = [&](int64_t flag, int64_t value, const char* name) {
      LOOM_CHECK(flag == 0 || flag == value,
                 "--{}: {} contradicts the checkpoint '{}', whose config.json gives {}; drop the "
                 "flag (the checkpoint's sizes are used)",
                 name, flag, f.init_from, value);
    };
    agree(f.n_layer, config.n_layers, "n-layer");
    agree(f.n_head, config.n_heads, "n-head");
    agree(f.n_embd, config.dim, "n-embd");
    agree(f.block_size, config.max_seq_len, "block-size");
    agree(f.vocab_size, config.vocab_size, "vocab-size");
  } else {
    if (f.n_layer) config.n_layers = f.n_layer;
    if (f.n_head) config.n_heads = f.n_head;
    if (f.n_embd) config.dim = f.n_embd;
    if (f.block_size) config.max_seq_len = f.block_size;
  }
  LOOM_CHECK(f.seq_len <= config.max_seq_len,
             "--seq-len: {} tokens per sequence is more than the model's context of {}", f.seq_len,
             config.max_seq_len);
  return config;
}

// The vocabulary: the data's, unless the checkpoint or --vocab-size sets a larger one (padding).
int64_t vocab_size(const ModelChoice& model, const data::TokenData& data) {
  if (model.vocab_from.empty()) return data.vocab_size;
  LOOM_CHECK(data.vocab_size <= model.config.vocab_size,
             "--data: {} has a vocabulary of {} tokens, more than the model's {} ({}); its "
             "tokens would not fit the embedding",
             data.description, data.vocab_size, model.config.vocab_size, model.vocab_from);
  return model.config.vocab_size;
}

// The job's model on its mesh: a GPT preset (tiny, small) or a Llama one (llama-tiny), the
// vocabulary set from the data as vocab_size() says, and what the rest of the job needs to know
// of it.
struct JobModel {
  std::unique_ptr<train::ParallelModel> model;
  int64_t vocab_size = 0;
  int64_t parameters = 0;
  nlohmann::json fields;  // its sizes, as checkpoints record them
};

bool is_llama(const Flags& f) { return f.model.rfind("llama", 0) == 0; }

// The job's GPT or Llama config with its vocabulary resolved against the data: what training
// builds and what --plan traces.
models::GPTConfig gpt_job_config(const Flags& f, const data::TokenData& tokens) {
  const ModelChoice choice = model_config(f);
  models::GPTConfig config = choice.config;
  config.vocab_size = vocab_size(choice, tokens);
  return config;
}

models::LlamaConfig llama_job_config(const Flags& f, const data::TokenData& tokens) {
  models::LlamaConfig config = llama_config(f);
  // The vocabulary: the checkpoint's or --vocab-size when given, else the data's.
  if (f.init_from.empty() && !f.vocab_size) config.vocab_size = tokens.vocab_size;
  if (f.vocab_size) config.vocab_size = f.vocab_size;
  LOOM_CHECK(tokens.vocab_size <= config.vocab_size,
             "--data: {} has a vocabulary of {} tokens, more than the model's {}; its tokens "
             "would not fit the embedding",
             tokens.description, tokens.vocab_size, config.vocab_size);
  return config;
}

JobModel build_job_model(const Flags& f, const data::TokenData& tokens,
                         const std::shared_ptr<const DeviceMesh>& mesh,
                         const train::ParallelConfig& parallel) {
  JobModel job;
  if (!is_llama(f)) {
    const models::GPTConfig config = gpt_job_config(f, tokens);
    job.model = train::build_parallel_gpt(config, f.seed, mesh, parallel);
    job.vocab_size = config.vocab_size;
    job.parameters = config.parameter_count();
    job.fields = train::model_fields(config);
    return job;
  }
  const models::LlamaConfig config = llama_job_config(f, tokens);
  job.model = train::build_parallel_llama(config, f.seed, mesh, parallel);
  job.vocab_size = config.vocab_size;
  job.parameters = config.parameter_count();
  job.fields = train::model_fields(config);
  return job;
}

// The data-parallel degrees resolved into the flags (so the effective config repeats the run):
// --dp as dp_replicate, the default dp 2, --dp-shard -1 against the launcher's WORLD_SIZE or
// --nproc. A --nproc that is not the degrees' product is an error naming both.
void resolve_parallel_degrees(Flags& f) {
  const char* launched_world = std::getenv("RANK") ? std::getenv("WORLD_SIZE") : nullptr;
  const int64_t world = launched_world ? std::atoll(launched_world) : f.nproc;
  const train::ParallelDims dims = train::data_parallel_dims(f, world);
  f.dp = 0;
  f.dp_replicate = dims.dp_replicate;
  f.dp_shard = dims.dp_shard;
  LOOM_CHECK(f.nproc == 0 || f.nproc == dims.world_size(),
             "--nproc {}: the degrees {} make {} ranks; give degrees whose product is {} (or "
             "--dp-shard -1 to take what the others leave)",
             f.nproc, dims.str(), dims.world_size(), f.nproc);
}

// The job's parallel layout from the flags (validated against the world and the batch in run).
train::ParallelConfig parallel_config(const Flags& f) {
  return {.dims = job_dims(f),
          .tp_plan = {.sequence_parallel = f.sequence_parallel},
          .grad_accum = static_cast<int>(f.grad_accum),
          .pipeline = {.schedule = f.schedule,
                       .microbatches = static_cast<int>(f.microbatches),
                       .virtual_stages = static_cast<int>(f.virtual_stages)},
          .mixed_precision = f.mixed_precision == "bf16" ? std::optional<nn::MixedPrecisionPolicy>(
                                                               nn::MixedPrecisionPolicy{})
                                                         : std::nullopt};
}

int run(Flags f) {
  const Device device = resolve_device(f.device);
  // GPU ranks talk over NCCL, CPU ranks over Gloo.
  comm::InitOptions init;
  if (f.collective_timeout_s > 0) {
    init.timeout = std::chrono::duration_cast<comm::Duration>(
        std::chrono::duration<double>(f.collective_timeout_s));
  }
  auto world = comm::init_process_group(device.is_cuda() ? "nccl" : "gloo", init);
  const int rank = world->rank();
  const train::ParallelConfig parallel = parallel_config(f);
  parallel.validate(world->size(), f.batch_size, f.seq_len);

  // pp outermost, tp innermost (torchtitan's order): tensor-parallel peers are neighbours.
  const auto mesh = parallel.dims.build_mesh(world);

  const data::TokenData tokens = data::load_tokens(f.data);
  const JobModel job = build_job_model(f, tokens, mesh, parallel);
  const auto& model = job.model;
  // Every rank reads the checkpoint and keeps its own shards (no communication).
  if (!f.init_from.empty()) {
    model->load(f.init_from);
    if (rank == 0) fmt::print("train_gpt: initialized from {}\n", f.init_from);
  }
  train::Trainer trainer(*model, mesh, {.lr = lr_schedule(f), .weight_decay = 0.1, .clip = f.clip});
  // --resume: the latest committed checkpoint, saved on any layout.
  if (f.resume) {
    const auto latest = checkpoint::latest_committed_step(f.checkpoint_dir);
    if (!latest) {
      if (rank == 0) {
        fmt::print("train_gpt: --resume: no committed checkpoint in {}; starting at step 0\n",
                   f.checkpoint_dir);
      }
    } else {
      const std::string dir = checkpoint::step_directory(f.checkpoint_dir, *latest);
      train::check_same_model(checkpoint::read_metadata(dir), job.fields, dir);
      const checkpoint::Metadata saved = trainer.load_checkpoint(dir, *world);
      const std::string layout = train::saved_layout(saved);
      if (rank == 0) {
        fmt::print("train_gpt: resumed from {} at step {}{}\n", dir, trainer.steps_done(),
                   layout == mesh->str()
                       ? fmt::format(" (same layout)")
                       : fmt::format(" (saved on {}, now {})", layout, mesh->str()));
      }
    }
  }

  const double entropy = data::unigram_entropy(tokens);
  const int64_t parameters = job.parameters;
  train::LineWriter metrics;
  if (rank == 0) {
    // The effective config, once: printed, and written beside the metrics so that
    // `--config <that file>` repeats the run exactly.
    const std::string effective = train::to_toml(f);
    const std::string effective_path = config_path_beside(f.metrics_out);
    fmt::print("train_gpt: effective config (also in {}):\n{}", effective_path, effective);
    train::write_file(effective_path, effective, "--metrics-out (the effective config beside it)");
    fmt::print("train_gpt: {} params, {} on {}; data {}; unigram entropy {:.3f} nats\n", parameters,
               f.model, mesh->str(), tokens.description, entropy);
    metrics = train::LineWriter(f.metrics_out, "--metrics-out");
  }
  double last_loss = 0;
  std::vector<double> losses;
  ProgressBar progress(rank == 0 && f.progress);
  trainer.add_step_hook([&](const train::StepResult& r) {
    last_loss = r.loss;
    losses.push_back(r.loss);
    if (rank != 0) return;
    const double tokens_per_s = f.batch_size * f.seq_len / (r.ms / 1000.0);
    nlohmann::json line{{"step", r.step},
                        {"loss", r.loss},
                        {"lr", r.lr},
                        {"tokens_per_s", tokens_per_s},
                        {"ms_per_step", r.ms},
                        {"peak_mem_bytes", peak_memory_bytes(device)},
                        {"grad_norm", r.grad_norm}};
    metrics.write_line(line.dump());
    if (r.step % f.log_every == 0 || r.step + 1 == f.steps) {
      progress.clear();
      fmt::print(
          "step {:5d} | loss {:.4f} | lr {:.2e} | {:8.0f} tok/s | {:7.1f} ms | peak {:.0f} MiB\n",
          r.step, r.loss, r.lr, tokens_per_s, r.ms, peak_memory_bytes(device) / 1048576.0);
      std::fflush(stdout);
    }
    progress.update(r.step, f.steps, r.loss, tokens_per_s);
  });
  // Distributed checkpoints: every --checkpoint-every steps and after the last; with
  // --async-checkpoint the state is staged to host memory and committed in the background.
  std::unique_ptr<checkpoint::AsyncSaver> async_saver;
  if (!f.checkpoint_dir.empty() && f.async_checkpoint) {
    async_saver = std::make_unique<checkpoint::AsyncSaver>(world);  // collective: its group
  }
  const auto report_committed = [&](const std::string& dir) {
    if (rank != 0 || dir.empty()) return;
    progress.clear();
    fmt::print("train_gpt: checkpoint {} committed\n", dir);
  };
  if (!f.checkpoint_dir.empty()) {
    trainer.add_step_hook([&](const train::StepResult& r) {
      const bool last = r.step + 1 == f.steps;
      if (!last && (f.checkpoint_every == 0 || (r.step + 1) % f.checkpoint_every != 0)) return;
      const auto start = std::chrono::steady_clock::now();
      const nlohmann::json fields = train::job_checkpoint_fields(job.fields, *mesh);
      const checkpoint::SaveOptions options{.keep_last = static_cast<int>(f.keep_last)};
      std::string committed;
      if (async_saver) {
        committed = async_saver->wait();  // the previous save, committed in the background
        async_saver->save(trainer.checkpoint_state(fields), f.checkpoint_dir, trainer.steps_done(),
                          options);
      } else {
        committed = trainer.save_checkpoint(f.checkpoint_dir, *world, fields, options);
      }
      const double stall_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
      report_committed(committed);
      if (rank == 0) {
        fmt::print("train_gpt: checkpoint of step {}: training stalled {:.1f} ms{}\n",
                   trainer.steps_done(), stall_ms,
                   async_saver ? " (async: staged, committing in the background)" : "");
      }
    });
  }
  const int first_step = trainer.steps_done();
  for (int step = first_step; step < f.steps; ++step) {
    // The op timer skips the first step (allocator, plans and caches warming up).
    if (f.profile_ops && step == first_step + 1) {
      // LOOM_PROFILE may add per-shape rows ("ops,shapes"); a GPU always synchronizes.
      profiler::Options options = profiler::environment_options();
      options.synchronize = options.synchronize || device.is_cuda();
      profiler::enable(options);
    }
    const data::Batch batch =
        train::local_batch(tokens, f.seed, step, *mesh, f.batch_size, f.seq_len);
    trainer.step(batch.inputs, batch.targets);
  }
  progress.clear();
  if (profiler::enabled()) {
    profiler::disable();
    if (rank == 0) {
      fmt::print(
          "train_gpt: op times on rank 0 over steps {}..{} (self: minus nested ops and "
          "scopes{}):\n{}",
          first_step + 1, f.steps - 1, device.is_cuda() ? "; each op waited for its kernels" : "",
          profiler::table(40));
    }
  }
  if (async_saver) report_committed(async_saver->wait());
  // Every rank gathers (full_tensor over tp); rank 0 writes.
  if (!f.save.empty()) {
    model->save(f.save, /*write=*/rank == 0);
    if (rank == 0)
      fmt::print(
          "train_gpt: saved {} (Hugging Face safetensors, config.json beside it for Llama)\n",
          f.save);
  }
  // A sample, generated by every rank together (TP layers and pipeline stages communicate),
  // printed by rank 0.
  {
    NoGradGuard no_grad;
    std::vector<int64_t> context{tokens.tokens[0]};
    for (int i = 0; i < f.sample_tokens; ++i) {
      const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(context.size()) - f.seq_len);
      std::vector<int64_t> window(context.begin() + start, context.end());
      const int64_t length = static_cast<int64_t>(window.size());
      // Sequence parallelism needs a length that divides by tp: pad on the right, which causal
      // attention keeps from affecting the positions before it.
      window.resize((length + f.tp - 1) / f.tp * f.tp, 0);
      const Tensor logits = model->logits(
          ops::from_vector_i64(window, {1, static_cast<int64_t>(window.size())}, device));
      const Tensor last = ops::narrow(ops::reshape(logits, {-1, job.vocab_size}), 0, length - 1, 1);
      const auto probs = ops::to_vector(ops::softmax(last, 1));
      // Sample with a counter-based draw (same on every rank).
      const double u = ops::to_vector(ops::uniform({1}, f.seed + 7919 * i, 0.0, 1.0))[0];
      double acc = 0;
      int64_t choice = static_cast<int64_t>(probs.size()) - 1;
      for (size_t t = 0; t < probs.size(); ++t) {
        acc += probs[t];
        if (u < acc) {
          choice = static_cast<int64_t>(t);
          break;
        }
      }
      context.push_back(choice);
    }
    if (rank == 0 && tokens.vocab_size == 256) {
      std::string text;
      for (int64_t t : context) text += t < 256 ? static_cast<char>(t) : '?';  // padding ids
      fmt::print("sample:\n{}\n", text);
    }
  }
  if (rank == 0) {
    metrics.close();
    fmt::print("final loss {:.4f} (unigram entropy {:.3f}); metrics: {}\n", last_loss, entropy,
               f.metrics_out);
    write_plot(losses, entropy, f.plot_out);
  }
  // Rank 0 serves the store every group reports to: it leaves last, after every rank is done.
  world->barrier()->wait();
  return 0;
}

}  // namespace

// The paths a job reads and writes, checked before anything starts: a missing input or an output
// that cannot be written is a bad flag (exit 2), not a failure after the training.
void check_paths(const Flags& f) {
  const auto readable_file = [](const std::string& path, std::string_view flag) {
    std::error_code ec;
    LOOM_CHECK(std::filesystem::exists(path, ec), "{}: '{}' does not exist", flag, path);
    LOOM_CHECK(std::filesystem::is_regular_file(path, ec), "{}: '{}' is not a file", flag, path);
    LOOM_CHECK(::access(path.c_str(), R_OK) == 0, "{}: cannot read '{}': {}", flag, path,
               std::strerror(errno));
  };
  readable_file(f.data, "--data");
  LOOM_CHECK(!f.resume || !f.checkpoint_dir.empty(),
             "--resume: needs --checkpoint-dir (the directory whose latest committed step to "
             "continue from)");
  LOOM_CHECK(!f.checkpoint_dir.empty() ||
                 (f.checkpoint_every == 0 && f.keep_last == 0 && !f.async_checkpoint),
             "--checkpoint-every, --keep-last and --async-checkpoint: need --checkpoint-dir "
             "(where the checkpoints go)");
  LOOM_CHECK(f.checkpoint_dir.empty() || !std::filesystem::exists(f.checkpoint_dir) ||
                 std::filesystem::is_directory(f.checkpoint_dir),
             "--checkpoint-dir: '{}' exists and is not a directory", f.checkpoint_dir);
  if (!f.init_from.empty()) readable_file(f.init_from, "--init-from");
  train::check_writable(f.metrics_out, "--metrics-out");
  train::check_writable(config_path_beside(f.metrics_out), "--metrics-out");
  train::check_writable(f.plot_out, "--plot-out");
  if (!f.save.empty()) train::check_writable(f.save, "--save");
}

// ./loom plan: the job validated and sized as build_parallel_gpt would lay it out (no rank, no
// model tensor). The vocabulary is resolved as run() resolves it (the data's unless fixed).
// The machine a plan predicts the step time on (--plan-*): this one's calibration by default.
struct PlanMachineFlags {
  double rank_tflops = 0;     // matrix-product TFLOP/s of one rank
  double link_gbps = 0;       // GB/s of one link
  double latency_us = 0;      // one collective step
  double peak_tflops = 0;     // one rank's peak, for MFU
  double memory_gbps = 0;     // one rank's memory bandwidth (memory-bound ops)
  std::string dim_link_gbps;  // "dp_shard=25,pp=25": links of these mesh dims
};

// The machine the plan predicts on: the flags' (another machine), else this one's calibration
// shared by the job's ranks; nullopt (and why, in `missing`) when there is neither.
std::optional<train::MachineModel> plan_machine(const PlanMachineFlags& m, int64_t ranks,
                                                bool gpu_job, std::string* missing) {
  std::optional<train::MachineModel> machine;
  if (m.rank_tflops > 0) {
    LOOM_CHECK(m.link_gbps > 0,
               "--plan-rank-tflops {} needs --plan-link-gbps (the links' GB/s) as well",
               m.rank_tflops);
    machine = train::MachineModel{.rank_flops_per_s = m.rank_tflops * 1e12,
                                  .seconds_per_written_byte = 0,
                                  .seconds_per_op = 0,
                                  .latency_s = (m.latency_us > 0 ? m.latency_us : 10.0) * 1e-6,
                                  .bytes_per_s = m.link_gbps * 1e9,
                                  .source = "given by --plan-rank-tflops, --plan-link-gbps"};
    // An op's output byte costs two read and one written (as calibrate_machine measures).
    if (m.memory_gbps > 0) machine->seconds_per_written_byte = 3.0 / (m.memory_gbps * 1e9);
  } else if (gpu_job) {
    *missing =
        "no step time: this machine's calibration is for CPU ranks; give the GPUs' figures "
        "(--plan-rank-tflops, --plan-link-gbps, and --plan-memory-gbps, --plan-peak-tflops)";
    return std::nullopt;
  } else if (const auto calibration = train::load_calibration()) {
    machine = train::MachineModel::for_cpu_ranks(*calibration, ranks);
  } else {
    *missing = fmt::format(
        "no step time: run `./loom plan --calibrate` once to measure this machine (stored in "
        "{}), or give --plan-rank-tflops and --plan-link-gbps for another",
        train::calibration_path());
    return std::nullopt;
  }
  if (m.peak_tflops > 0) machine->peak_flops_per_s = m.peak_tflops * 1e12;
  // --plan-dim-link-gbps dim=GBPS[,dim=GBPS...]
  std::stringstream items(m.dim_link_gbps);
  const std::vector<std::string> names = train::ParallelDims{}.names();
  for (std::string item; std::getline(items, item, ',');) {
    const auto eq = item.find('=');
    const std::string dim = item.substr(0, eq);
    double gbps = 0;
    try {
      gbps = eq == std::string::npos ? 0 : std::stod(item.substr(eq + 1));
    } catch (const std::exception&) {
      gbps = 0;  // reported below
    }
    LOOM_CHECK(eq != std::string::npos && gbps > 0 &&
                   std::find(names.begin(), names.end(), dim) != names.end(),
               "--plan-dim-link-gbps: expected DIM=GBPS items separated by commas, DIM one of "
               "{}, GBPS a positive number; got '{}'",
               fmt::join(names, ", "), item);
    machine->dim_bytes_per_s[dim] = gbps * 1e9;
  }
  return machine;
}

int calibrate() {
  try {
    const nlohmann::json figures = train::calibrate_machine();
    const std::string path = train::calibration_path();
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ofstream(path) << figures.dump(2) << "\n";
    fmt::print("{}\nwritten to {}\n", figures.dump(2), path);
    return 0;
  } catch (const std::exception& error) {
    fmt::print(stderr, "train_gpt --calibrate: {}\n", error.what());
    return 1;
  }
}

int print_plan(const Flags& f, const PlanMachineFlags& machine_flags) {
  try {
    const data::TokenData tokens = data::load_tokens(f.data);
    std::string missing;
    train::PlanOptions options;
    // A CPU job is traced allocating as the CPU's kernels do; --device cuda (or auto with a GPU
    // here) as a GPU's.
    options.target = f.device == "cpu" || (f.device == "auto" && !cuda::available())
                         ? Device::cpu()
                         : Device::cuda();
    options.machine =
        plan_machine(machine_flags, job_dims(f).world_size(), options.target.is_cuda(), &missing);
    const train::JobPlan plan =
        is_llama(f) ? train::plan_llama_job(llama_job_config(f, tokens), parallel_config(f),
                                            f.batch_size, f.seq_len, options)
                    : train::plan_gpt_job(gpt_job_config(f, tokens), parallel_config(f),
                                          f.batch_size, f.seq_len, options);
    fmt::print("{}", train::format_job_plan(plan));
    if (!missing.empty()) fmt::print("\n{}\n", missing);
    return 0;
  } catch (const Error& error) {
    fmt::print(stderr, "train_gpt --plan: {}\n", error.what());
    return 1;
  }
}

// Flags and the --config file -> the job's settings. Exits 0 after --help; throws CLI::ParseError
// for flags CLI11 rejects (unknown, missing value) and loom::Error for a bad value or file.
struct Parsed {
  Flags flags;
  std::string launcher;
  bool help = false;
  bool plan = false;       // --plan (./loom plan): print the job's plan and exit, starting no rank
  bool calibrate = false;  // --calibrate (./loom plan --calibrate): measure this machine
  PlanMachineFlags machine;
};

Parsed parse_command_line(int argc, char** argv) {
  CLI::App app{
      "Train a GPT with data, tensor and pipeline parallelism (./loom train). Settings come from "
      "the defaults, then --config FILE (TOML, sections as below), then the flags given."};
  std::string config_file;
  app.add_option("--config", config_file,
                 "TOML job file: [model], [parallel], [training], [data], [checkpoint], "
                 "[output]; flags on the command line override it");
  Parsed parsed;
  app.add_option("--launcher", parsed.launcher,
                 "loomrun, used to start the ranks when not launched");
  app.add_flag("--plan", parsed.plan,
               "validate the job and trace a step of it on the meta device: each rank's memory, "
               "FLOPs, communication and the step time, starting no rank (./loom plan; "
               "train/job_plan.h)");
  app.add_flag("--calibrate", parsed.calibrate,
               "with --plan: measure this machine's GEMM rate and Gloo latency and bandwidth "
               "for the step-time model, store them (train/step_time_model.h) and exit");
  app.add_option("--plan-rank-tflops", parsed.machine.rank_tflops,
                 "with --plan: predict the step on ranks of this many matrix-product TFLOP/s "
                 "(another machine; default: this one's calibration)");
  app.add_option("--plan-link-gbps", parsed.machine.link_gbps,
                 "with --plan-rank-tflops: the links' GB/s");
  app.add_option("--plan-latency-us", parsed.machine.latency_us,
                 "with --plan-rank-tflops: one collective step's latency in microseconds "
                 "(default 10)");
  app.add_option("--plan-peak-tflops", parsed.machine.peak_tflops,
                 "with --plan: one rank's peak TFLOP/s, to print the MFU");
  app.add_option("--plan-memory-gbps", parsed.machine.memory_gbps,
                 "with --plan-rank-tflops: one rank's memory GB/s (elementwise ops)");
  app.add_option("--plan-dim-link-gbps", parsed.machine.dim_link_gbps,
                 "with --plan: the links of some mesh dims, where not --plan-link-gbps, e.g. "
                 "dp_shard=25,pp=25 (InfiniBand between hosts)");
  const auto options = train::job_options();
  const train::JobConfig defaults;
  std::vector<std::string> raw(options.size());
  for (size_t i = 0; i < options.size(); ++i) {
    const train::JobOption& o = options[i];
    const std::string help = fmt::format("{}; default {} ([{}] {})", o.help,
                                         train::option_toml(defaults, o), o.section, o.key);
    if (o.is_bool()) {
      app.add_flag_callback(
          o.flag(), [&raw, i] { raw[i] = "true"; }, help);
      std::string no = "--no-" + o.flag().substr(2);
      app.add_flag_callback(
          no, [&raw, i] { raw[i] = "false"; }, "turn " + o.flag() + " off");
    } else {
      const char* type = std::holds_alternative<int64_t train::JobConfig::*>(o.field)  ? "INT"
                         : std::holds_alternative<double train::JobConfig::*>(o.field) ? "FLOAT"
                                                                                       : "TEXT";
      app.add_option(o.flag(), raw[i], help)
          ->type_name(type)
          ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app.help());
    parsed.help = true;
    return parsed;
  }
  if (!config_file.empty()) train::load_job_toml(parsed.flags, config_file);
  for (size_t i = 0; i < options.size(); ++i) {
    if (!raw[i].empty()) train::set_option(parsed.flags, options[i], raw[i], options[i].flag());
  }
  resolve_parallel_degrees(parsed.flags);
  check_paths(parsed.flags);
  // The sizes and the context, before anything starts.
  if (is_llama(parsed.flags)) {
    llama_config(parsed.flags).validate();
  } else {
    model_config(parsed.flags).config.validate();
  }
  return parsed;
}

int main(int argc, char** argv) {
  keep_freed_host_memory();  // tensor/host_memory.h: why
  // Bad flags and config files exit 2, like loomrun's; a failure while training exits 1.
  Parsed parsed;
  try {
    parsed = parse_command_line(argc, argv);
  } catch (const CLI::ParseError& error) {
    fmt::print(stderr, "train_gpt: {}\n", error.what());
    return 2;
  } catch (const Error& error) {
    fmt::print(stderr, "train_gpt: {}\n", error.what());
    return 2;
  }
  if (parsed.help) return 0;
  if (parsed.calibrate) return calibrate();
  if (parsed.plan) return print_plan(parsed.flags, parsed.machine);
  try {
    const Flags& f = parsed.flags;
    if (std::getenv("RANK") == nullptr) {
      // Not launched. A WORLD_SIZE left in the environment means a launcher was meant to run
      // this: never a silent one-rank run of a job meant to be several.
      const char* world_size = std::getenv("WORLD_SIZE");
      LOOM_CHECK(world_size == nullptr,
                 "train_gpt: WORLD_SIZE={} is set but RANK is not; a launcher (loomrun, torchrun) "
                 "sets both for each rank. Unset WORLD_SIZE to let train_gpt start its own ranks",
                 world_size ? world_size : "");
      if (job_dims(f).world_size() > 1) relaunch(f, parsed.launcher, argc, argv);
      // One process: it is the whole world (MASTER_PORT is picked by the rendezvous).
      setenv("RANK", "0", 1);
      setenv("WORLD_SIZE", "1", 1);
    }
    return run(f);
  } catch (const Error& error) {
    // The messages name train_gpt (or the library function that failed) themselves.
    fmt::print(stderr, "{}\n", error.what());
    return 1;
  } catch (const std::exception& error) {
    fmt::print(stderr, "train_gpt: unexpected error: {}\n", error.what());
    return 1;
  } catch (...) {
    fmt::print(stderr, "train_gpt: unexpected error of an unknown type\n");
    return 1;
  }
}
