// `./loom train`: train a GPT on CPU ranks with data parallelism (DDP over "dp"), tensor
// parallelism (Megatron-style over "tp") and pipeline parallelism (stages over "pp"), on text
// that needs no download.
//
//   ./loom train                         # tiny GPT, dp=2 x tp=2 = 4 ranks, GPL-3 text
//   ./loom train --dp 2 --tp 2 --pp 2    # 3-D: 8 ranks, 1F1B over pp = 2 microbatches
//   ./loom train --dp 1 --tp 1 --steps 50 --data my.txt
//
// Started without a launcher (no RANK in the environment) and with more than one rank, the
// program re-launches itself under loomrun (--launcher), one process per rank. Rank 0 prints
// one line per step (loss, lr, tokens/s, ms/step, peak memory), writes the metrics as JSONL, a
// loss-curve PNG (gnuplot) and a generated sample at the end.
#include <fmt/format.h>
#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numbers>

#include "autograd/grad_mode.h"
#include "base/error.h"
#include "comm/init.h"
#include "comm/launch_env.h"
#include "mesh/device_mesh.h"
#include "models/data/token_data.h"
#include "models/gpt/config.h"
#include "optim/lr_schedule.h"
#include "tensor/cuda/caching_allocator.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/ops.h"
#include "train/parallel_gpt.h"
#include "train/trainer.h"

namespace {

using namespace loom;

struct Flags {
  int dp = 2, tp = 2, pp = 1;
  int steps = 300;
  int batch_size = 16;  // global batch, in sequences per optimizer step
  int seq_len = 64;
  int grad_accum = 1;
  std::string model = "tiny";
  int n_layer = 0, n_head = 0, n_embd = 0;
  double lr = 3e-3;
  uint64_t seed = 1337;
  std::string data = "/usr/share/common-licenses/GPL-3";
  std::string metrics_out = "train_gpt_metrics.jsonl";
  std::string plot_out = "train_gpt_loss.png";
  std::string init_from, save;
  std::string launcher;
  double clip = 1.0;  // gradient-norm clip
  int sample_tokens = 200;
  int log_every = 10;
  bool progress = true;           // a progress bar on the terminal (/dev/tty), when there is one
  bool sequence_parallel = true;  // with tp > 1: norms and dropout on sequence shards
  std::string schedule = "1f1b";  // with pp > 1
  int microbatches = 0;  // 0: pp x virtual stages (every stage busy once the pipeline fills)
  int virtual_stages = 1;
  std::string mixed_precision = "none";  // bf16: bf16 compute over f32 master weights
  std::string device = "auto";           // auto: cuda when a GPU is visible, else cpu
};

// Warmup over the first 5% of the steps, then cosine decay to 10% of the peak (nanoGPT's).
optim::WarmupCosine lr_schedule(const Flags& f) {
  return {.peak_lr = f.lr,
          .warmup_steps = std::min(std::max(1, f.steps / 20), f.steps - 1),
          .total_steps = f.steps,
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

[[noreturn]] void relaunch(const Flags& f, int argc, char** argv) {
  const int world = f.dp * f.tp * f.pp;
  LOOM_CHECK(!f.launcher.empty(),
             "train_gpt: {} ranks requested (dp={} tp={} pp={}) but no launcher: run under "
             "loomrun, or pass "
             "--launcher PATH_TO_LOOMRUN (./loom train does)",
             world, f.dp, f.tp, f.pp);
  std::vector<std::string> args{f.launcher, "--nproc-per-node", std::to_string(world), "--"};
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  args.push_back(n > 0 ? std::string(self, n) : argv[0]);
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  std::vector<char*> c_args;
  for (auto& a : args) c_args.push_back(a.data());
  c_args.push_back(nullptr);
  std::fflush(stdout);
  execv(c_args[0], c_args.data());
  LOOM_FAIL("train_gpt: could not start the launcher '{}': {}", f.launcher, std::strerror(errno));
}

void write_plot(const std::vector<double>& losses, double entropy, const std::string& png) {
  const std::string data = png + ".dat", script = png + ".gnuplot";
  std::ofstream points(data);
  for (size_t step = 0; step < losses.size(); ++step) points << step << " " << losses[step] << "\n";
  points.close();
  std::ofstream out(script);
  out << "set terminal pngcairo size 800,500\nset output '" << png
      << "'\nset xlabel 'step'\nset ylabel 'loss (nats)'\n"
      << "set title 'train_gpt' noenhanced\nset grid\nplot '" << data
      << "' using 1:2 with lines title 'loss', " << entropy
      << " with lines dashtype 2 title 'unigram entropy of the data'\n";
  out.close();
  if (std::system(fmt::format("gnuplot '{}' 2>/dev/null", script).c_str()) == 0) {
    fmt::print("loss curve: {}\n", png);
  } else {
    fmt::print(
        "loss curve: gnuplot failed or is missing (./loom setup installs it); the losses are in "
        "{}\n",
        data);
  }
}

// Tensors of a training step are freed and allocated again at the same sizes every step. glibc
// serves blocks over its mmap threshold (128 KiB, adapting up to 32 MiB) with fresh mmaps and
// returns freed heap tops to the kernel, so each step page-faults and zeroes its activations anew
// (perf: a quarter of `small`'s time in the kernel, clear_page). Keeping freed memory in the
// heap for reuse makes `--model small` on 1 rank ~30% faster (64-78 -> 80-102 tokens/s, A/B runs
// alternated); peak memory is unchanged because the step's peak is what the heap grows to anyway.
// An application's choice, like PyTorch's advice to preload jemalloc for CPU training.
void keep_freed_tensor_memory() {
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

// The job's parallel layout from the flags (validated against the world and the batch in run).
train::ParallelConfig parallel_config(const Flags& f) {
  return {.dims = {.pp = f.pp, .dp = f.dp, .tp = f.tp},
          .tp_plan = {.sequence_parallel = f.sequence_parallel},
          .grad_accum = f.grad_accum,
          .pipeline = {.schedule = f.schedule,
                       .microbatches = f.microbatches,
                       .virtual_stages = f.virtual_stages},
          .mixed_precision = f.mixed_precision == "bf16" ? std::optional<nn::MixedPrecisionPolicy>(
                                                               nn::MixedPrecisionPolicy{})
                                                         : std::nullopt};
}

int run(Flags f) {
  const Device device = resolve_device(f.device);
  // GPU ranks talk over NCCL, CPU ranks over Gloo.
  auto world = comm::init_process_group(device.is_cuda() ? "nccl" : "gloo");
  const int rank = world->rank();
  const train::ParallelConfig parallel = parallel_config(f);
  parallel.validate(world->size(), f.batch_size, f.seq_len);
  // pp outermost, tp innermost (torchtitan's order): tensor-parallel peers are neighbours.
  const auto mesh = parallel.dims.build_mesh(world);

  const data::TokenData tokens = data::load_tokens(f.data);
  models::GPTConfig config = models::GPTConfig::preset(f.model);
  if (f.n_layer) config.n_layer = f.n_layer;
  if (f.n_head) config.n_head = f.n_head;
  if (f.n_embd) config.n_embd = f.n_embd;
  config.vocab_size = tokens.vocab_size;
  config.block_size = std::max<int64_t>(config.block_size, f.seq_len);
  const auto model = train::build_parallel_gpt(config, f.seed, mesh, parallel);
  // Every rank reads the checkpoint and keeps its own shards (no communication).
  if (!f.init_from.empty()) {
    model->load(f.init_from);
    if (rank == 0) fmt::print("train_gpt: initialized from {}\n", f.init_from);
  }
  train::Trainer trainer(*model, mesh, {.lr = lr_schedule(f), .weight_decay = 0.1, .clip = f.clip});

  const double entropy = data::unigram_entropy(tokens);
  const int64_t parameters = config.parameter_count();
  std::ofstream metrics;
  if (rank == 0) {
    fmt::print("train_gpt: {} params, {} on {}; data {}; unigram entropy {:.3f} nats\n", parameters,
               f.model, mesh->str(), tokens.description, entropy);
    metrics.open(f.metrics_out);
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
    metrics << line.dump() << "\n" << std::flush;
    if (r.step % f.log_every == 0 || r.step + 1 == f.steps) {
      progress.clear();
      fmt::print(
          "step {:5d} | loss {:.4f} | lr {:.2e} | {:8.0f} tok/s | {:7.1f} ms | peak {:.0f} MiB\n",
          r.step, r.loss, r.lr, tokens_per_s, r.ms, peak_memory_bytes(device) / 1048576.0);
      std::fflush(stdout);
    }
    progress.update(r.step, f.steps, r.loss, tokens_per_s);
  });
  for (int step = 0; step < f.steps; ++step) {
    const data::Batch batch =
        train::local_batch(tokens, f.seed, step, *mesh, f.batch_size, f.seq_len);
    trainer.step(batch.inputs, batch.targets);
  }
  progress.clear();
  // Every rank gathers (full_tensor over tp); rank 0 writes.
  if (!f.save.empty()) {
    model->save(f.save, /*write=*/rank == 0);
    if (rank == 0) fmt::print("train_gpt: saved {} (Hugging Face GPT-2 safetensors)\n", f.save);
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
      const Tensor last =
          ops::narrow(ops::reshape(logits, {-1, config.vocab_size}), 0, length - 1, 1);
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
      for (int64_t t : context) text += static_cast<char>(t);
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

int main(int argc, char** argv) {
  keep_freed_tensor_memory();
  Flags f;
  CLI::App app{"Train a GPT with data and tensor parallelism on CPU ranks"};
  app.add_option("--dp", f.dp, "data-parallel degree")->check(CLI::PositiveNumber);
  app.add_option("--tp", f.tp, "tensor-parallel degree")->check(CLI::PositiveNumber);
  app.add_option("--pp", f.pp, "pipeline-parallel degree (stages over ranks)")
      ->check(CLI::PositiveNumber);
  app.add_option("--microbatches", f.microbatches,
                 "with --pp: microbatches per step (split of each dp rank's batch); default pp x "
                 "virtual stages")
      ->check(CLI::PositiveNumber);
  app.add_option("--schedule", f.schedule, "with --pp: gpipe, 1f1b or interleaved")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved"}));
  app.add_option("--device", f.device,
                 "auto (cuda when a GPU is visible), cpu or cuda (one GPU per rank)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--mixed-precision", f.mixed_precision,
                 "bf16: compute in bf16 over f32 master weights (optimizer, clipping and DDP stay "
                 "f32); none: f32")
      ->check(CLI::IsMember({"none", "bf16"}));
  app.add_option("--virtual-stages", f.virtual_stages,
                 "with --schedule interleaved: stages per rank")
      ->check(CLI::PositiveNumber);
  app.add_option("--steps", f.steps, "optimizer steps")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", f.batch_size, "global batch in sequences per step")
      ->check(CLI::PositiveNumber);
  app.add_option("--seq-len", f.seq_len, "tokens per sequence")->check(CLI::PositiveNumber);
  app.add_option("--grad-accum", f.grad_accum, "micro-batches per step")
      ->check(CLI::PositiveNumber);
  app.add_option("--model", f.model, "tiny or small (GPT-2 124M)");
  app.add_option("--n-layer", f.n_layer, "override the preset's layers");
  app.add_option("--n-head", f.n_head, "override the preset's heads");
  app.add_option("--n-embd", f.n_embd, "override the preset's width");
  app.add_option("--lr", f.lr, "peak learning rate (warmup, then cosine)")
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", f.seed, "seed for initialization and batches");
  app.add_option("--clip", f.clip, "clip the global gradient norm to this")
      ->check(CLI::PositiveNumber);
  app.add_option("--data", f.data, "a text file (byte tokens) or a GPT-2 token .bin file");
  app.add_option("--metrics-out", f.metrics_out, "JSONL metrics, one object per step");
  app.add_option("--plot-out", f.plot_out, "loss-curve PNG");
  app.add_option(
      "--init-from", f.init_from,
      "Hugging Face GPT-2 safetensors checkpoint to start from (shapes must match the model)");
  app.add_option("--save", f.save, "Hugging Face GPT-2 safetensors file to write after training");
  app.add_option("--sample-tokens", f.sample_tokens, "tokens to generate at the end");
  app.add_flag("--sequence-parallel,!--no-sequence-parallel", f.sequence_parallel,
               "with --tp > 1, run norms and dropout on sequence shards (default: on)");
  app.add_option("--log-every", f.log_every, "print every N steps")->check(CLI::PositiveNumber);
  app.add_flag("!--no-progress", f.progress, "no progress bar on the terminal");
  app.add_option("--launcher", f.launcher, "loomrun, used to start the ranks when not launched");
  CLI11_PARSE(app, argc, argv);
  try {
    if (std::getenv("RANK") == nullptr) {
      if (f.dp * f.tp * f.pp > 1) relaunch(f, argc, argv);
      // One process: it is the whole world (MASTER_PORT is picked by the rendezvous).
      setenv("RANK", "0", 1);
      setenv("WORLD_SIZE", "1", 1);
    }
    return run(f);
  } catch (const Error& error) {
    // The messages name train_gpt (or the library function that failed) themselves.
    fmt::print(stderr, "{}\n", error.what());
    return 1;
  }
}
