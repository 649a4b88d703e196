// checkpoint_bench: save and load of a GPT's whole training state (parameters, AdamW moments)
// on 4 ranks (threads over loopback Gloo), synchronous and asynchronous: time and bytes per rank,
// and the training stall of an asynchronous save (the copy to host memory).
//
//   bazel run -c opt //tools/bench:checkpoint_bench                       # small, dp_shard 4
//   bazel run -c opt //tools/bench:checkpoint_bench -- --layout dp --model tiny
//
// The layout is FSDP over 4 (each rank owns a quarter of every tensor) or DDP over 4 (every rank
// holds everything; the save spreads the unique pieces over the ranks). The directory is under
// --dir (default: the system's temporary directory), removed at the end. Times are each rank's,
// the slowest printed; a save's time ends when it is committed (fsynced, renamed, marked).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <filesystem>

#include "checkpoint/distributed_checkpoint.h"
#include "data/token_data.h"
#include "models/gpt/family.h"
#include "tensor/host_memory.h"
#include "tools/bench/gloo_threads.h"
#include "train/parallel_model.h"
#include "train/trainer.h"

namespace {

using namespace loom;
using bench::Clock;
using bench::ms_since;
namespace fs = std::filesystem;

struct RankFigures {
  double sync_save_ms = 0, async_stall_ms = 0, async_total_ms = 0, load_ms = 0;
  int64_t written_bytes = 0;  // this rank's file
};

RankFigures run_rank(comm::ProcessGroup& pg, const std::string& model, const std::string& layout,
                     const std::string& dir) {
  const models::GPTConfig config = models::GPTConfig::preset(model);
  const train::ParallelDims dims = layout == "fsdp" ? train::ParallelDims{.dp_shard = 4}
                                                    : train::ParallelDims{.dp_replicate = 4};
  const auto mesh = dims.build_mesh(pg.shared_from_this());
  auto gpt = train::build_parallel_model(*models::gpt_args(config), 1, mesh, {.dims = dims});
  train::Trainer trainer(*gpt, mesh, {.lr = [](int) { return 1e-4; }});
  const auto data =
      data::TokenCorpus::from_tokens(std::vector<int32_t>(4096, 1), config.vocab_size, "ones");
  const auto batch = train::local_batch(data, 1, 0, *mesh, 4, 16);
  trainer.step(batch.inputs, batch.targets);  // the moments exist
  RankFigures f;
  const std::string root_sync = dir + "/sync", root_async = dir + "/async";
  pg.barrier()->wait();
  auto start = Clock::now();
  trainer.save_checkpoint(root_sync, pg);
  f.sync_save_ms = ms_since(start);
  const std::string file =
      checkpoint::step_directory(root_sync, 1) + "/" + checkpoint::rank_file_name(pg.rank());
  f.written_bytes = fs::exists(file) ? static_cast<int64_t>(fs::file_size(file)) : 0;
  checkpoint::AsyncSaver saver(pg.shared_from_this());
  pg.barrier()->wait();
  start = Clock::now();
  saver.save(trainer.checkpoint_state(), root_async, trainer.steps_done());
  f.async_stall_ms = ms_since(start);
  saver.wait();
  f.async_total_ms = ms_since(start);
  pg.barrier()->wait();
  start = Clock::now();
  trainer.load_checkpoint(checkpoint::step_directory(root_sync, 1), pg);
  f.load_ms = ms_since(start);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  keep_freed_host_memory();  // as loom_train: tensor/host_memory.h
  CLI::App app{"Distributed checkpoint save and load on 4 ranks: time, bytes, async stall"};
  std::string model = "small", layout = "fsdp";
  std::string dir = (fs::temp_directory_path() / "loom_checkpoint_bench").string();
  app.add_option("--model", model, "GPT preset")->check(CLI::IsMember({"tiny", "small"}));
  app.add_option("--layout", layout, "fsdp (dp_shard 4) or dp (DDP over 4)")
      ->check(CLI::IsMember({"fsdp", "dp"}));
  app.add_option("--dir", dir, "where the checkpoints go (removed at the end)");
  CLI11_PARSE(app, argc, argv);
  fs::remove_all(dir);
  const auto figures = bench::run_on_gloo_threads<RankFigures>(
      "checkpoint_bench", 4, "world", 600,
      [&](comm::ProcessGroup& pg) { return run_rank(pg, model, layout, dir); });
  const checkpoint::VerifySummary summary =
      checkpoint::verify(checkpoint::step_directory(dir + "/sync", 1));
  fs::remove_all(dir);
  RankFigures slowest;
  fmt::print("checkpoint_bench: GPT {} on 4 ranks ({}), {} entries, {:.1f} MiB in {} files\n",
             model, layout == "fsdp" ? "dp_shard 4" : "DDP over 4", summary.entries,
             summary.bytes / 1048576.0, summary.files);
  fmt::print("{:>5} | {:>11} | {:>13} | {:>16} | {:>14} | {:>9}\n", "rank", "wrote MiB",
             "sync save ms", "async stall ms", "async total ms", "load ms");
  for (size_t r = 0; r < figures.size(); ++r) {
    const RankFigures& f = figures[r];
    fmt::print("{:>5} | {:>11.1f} | {:>13.0f} | {:>16.0f} | {:>14.0f} | {:>9.0f}\n", r,
               f.written_bytes / 1048576.0, f.sync_save_ms, f.async_stall_ms, f.async_total_ms,
               f.load_ms);
    slowest.sync_save_ms = std::max(slowest.sync_save_ms, f.sync_save_ms);
    slowest.async_stall_ms = std::max(slowest.async_stall_ms, f.async_stall_ms);
    slowest.load_ms = std::max(slowest.load_ms, f.load_ms);
  }
  fmt::print(
      "slowest rank: sync save {:.0f} ms, async stall {:.0f} ms ({:.0f}% of the sync "
      "save), load {:.0f} ms\n",
      slowest.sync_save_ms, slowest.async_stall_ms,
      100.0 * slowest.async_stall_ms / slowest.sync_save_ms, slowest.load_ms);
  return 0;
}
