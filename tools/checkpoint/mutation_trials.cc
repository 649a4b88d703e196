// mutation_trials: damages copies of a committed checkpoint in every way a disk or a person can —
// a flipped bit in any file (shards, metadata, marker), a file cut short, a file deleted — and
// checks that every damaged copy is refused by verify() and by a full load, with a named error.
//
//   bazel run -c opt //tools/checkpoint:mutation_trials -- --trials 300
//   bazel run -c opt //tools/checkpoint:mutation_trials -- --trials 20 --checkpoint ckpt
//
// Without --checkpoint it first saves one of its own (a few DTensor-free entries of several
// dtypes, small blocks, on one rank). Prints the mutations tried and detected per kind; exits 1
// naming any mutation that went undetected.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "checkpoint/distributed_checkpoint.h"
#include "comm/gloo/process_group_gloo.h"
#include "comm/in_memory_store.h"
#include "tensor/ops.h"
#include "tensor/rng.h"

namespace {

using namespace loom;
namespace fs = std::filesystem;

// A small checkpoint of its own, on one rank.
std::string make_checkpoint(const std::string& root) {
  auto store = std::make_shared<comm::InMemoryStore>();
  auto pg = comm::ProcessGroupGloo::create(store, 0, 1, {.name = "mutation_trials"},
                                           comm::GlooOptions::loopback());
  checkpoint::StateDict state;
  state.tensors = {{"w", ops::uniform({64, 16}, 1, -1.0, 1.0)},
                   {"b", ops::uniform({16}, 2, -1.0, 1.0)},
                   {"emb", ops::to(ops::uniform({50, 8}, 3, -1.0, 1.0), kBFloat16)},
                   {"step", ops::from_vector_i64({4}, {1})}};
  state.extra = {{"note", "mutation_trials"}};
  return checkpoint::save(state, root, 1, *pg, {.block_bytes = 512});
}

// Every entry of the checkpoint, loaded whole on one rank.
void load_everything(const std::string& dir, const checkpoint::Metadata& metadata) {
  checkpoint::StateDict state;
  for (const auto& [name, entry] : metadata.entries) {
    state.tensors.emplace_back(name, ops::zeros(entry.shape, entry.dtype));
  }
  checkpoint::load(state, dir);
}

struct Mutation {
  std::string kind;  // flip | truncate | delete
  std::string file;
  int64_t where = 0;  // the byte (flip) or the new length (truncate)
  int bit = 0;
  std::string str() const {
    if (kind == "flip") return fmt::format("flip bit {} of byte {} of {}", bit, where, file);
    if (kind == "truncate") return fmt::format("truncate {} to {} bytes", file, where);
    return fmt::format("delete {}", file);
  }
};

void damage(const Mutation& m, const std::string& dir) {
  const fs::path path = fs::path(dir) / m.file;
  if (m.kind == "delete") {
    fs::remove(path);
  } else if (m.kind == "truncate") {
    fs::resize_file(path, static_cast<uintmax_t>(m.where));
  } else {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(m.where);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ (1 << m.bit));
    f.seekp(m.where);
    f.write(&c, 1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Damages copies of a checkpoint; every damage must be detected"};
  int trials = 300;
  uint64_t seed = 1;
  std::string source;
  std::string work = (fs::temp_directory_path() / "loom_mutation_trials").string();
  app.add_option("--trials", trials, "mutations to try")->check(CLI::Range(1, 100000));
  app.add_option("--seed", seed, "random seed of the mutations");
  app.add_option("--checkpoint", source, "a committed checkpoint (default: one of its own)");
  app.add_option("--work-dir", work, "where the damaged copies go (removed at the end)");
  CLI11_PARSE(app, argc, argv);
  try {
    fs::remove_all(work);
    fs::create_directories(work);
    const std::string original = source.empty()
                                     ? make_checkpoint((fs::path(work) / "source").string())
                                     : checkpoint::resolve_step_directory(source);
    checkpoint::verify(original);  // the undamaged checkpoint is fine
    std::vector<std::string> files;
    for (const auto& f : fs::directory_iterator(original)) {
      files.push_back(f.path().filename().string());
    }
    std::sort(files.begin(), files.end());
    std::mt19937_64 rng(seed);
    std::map<std::string, std::pair<int, int>> counts;  // kind -> (tried, detected)
    std::vector<std::string> undetected;
    const std::string copy = (fs::path(work) / "copy").string();
    for (int t = 0; t < trials; ++t) {
      Mutation m;
      m.kind = std::vector<std::string>{"flip", "flip", "truncate", "delete"}[rng() % 4];
      m.file = files[rng() % files.size()];
      const auto size = static_cast<int64_t>(fs::file_size(fs::path(original) / m.file));
      if (m.kind == "flip" || m.kind == "truncate") {
        if (size == 0) m.kind = "delete";
        m.where = size > 0 ? static_cast<int64_t>(rng() % static_cast<uint64_t>(size)) : 0;
        m.bit = static_cast<int>(rng() % 8);
      }
      fs::remove_all(copy);
      fs::copy(original, copy);
      damage(m, copy);
      bool by_verify = false, by_load = false;
      std::string message;
      try {
        checkpoint::verify(copy);
      } catch (const std::exception& e) {
        by_verify = true;
        message = e.what();
      }
      try {
        load_everything(copy, checkpoint::read_metadata(copy));
      } catch (const std::exception&) {
        by_load = true;
      }
      auto& [tried, detected] = counts[m.kind];
      ++tried;
      if (by_verify && by_load) {
        ++detected;
      } else {
        undetected.push_back(fmt::format("{} (verify: {}, load: {})", m.str(),
                                         by_verify ? "refused" : "accepted",
                                         by_load ? "refused" : "accepted"));
      }
    }
    fs::remove_all(work);
    int total_tried = 0, total_detected = 0;
    fmt::print("mutation_trials: {} mutations of {} ({} files)\n", trials, original, files.size());
    for (const auto& [kind, c] : counts) {
      fmt::print("  {:<9} tried {:>5}, detected {:>5}\n", kind, c.first, c.second);
      total_tried += c.first;
      total_detected += c.second;
    }
    fmt::print("detected {} of {}\n", total_detected, total_tried);
    for (const auto& u : undetected) fmt::print(stderr, "UNDETECTED: {}\n", u);
    return undetected.empty() ? 0 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "mutation_trials: {}\n", e.what());
    return 1;
  }
}
