// What the multi-rank benchmarks share: ranks as threads of one process, each with its own
// ProcessGroupGloo over loopback TCP (an InMemoryStore rendezvous), timestamps and medians, a
// random token batch and a GPT of the benchmark's sizes.
#pragma once

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/gloo/process_group_gloo.h"
#include "comm/in_memory_store.h"
#include "models/gpt/config.h"
#include "tensor/ops.h"

namespace loom::bench {

using Clock = std::chrono::steady_clock;

inline double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The share of the communication time `comm_ms` (run alone) that a run overlapping it hides:
// 1 - (overlapped - local) / comm, clamped to [0, 1] (local: the same compute without it).
inline double hidden_share(double overlapped_ms, double local_ms, double comm_ms) {
  if (comm_ms <= 0) return 1.0;
  return std::clamp(1.0 - (overlapped_ms - local_ms) / comm_ms, 0.0, 1.0);
}

// Runs `body` on `world` threads, rank r with its own group named `group` over loopback; returns
// each rank's result. A rank's exception is printed naming `program` and the rank, and the
// process exits 1.
template <class Result>
std::vector<Result> run_on_gloo_threads(const std::string& program, int world,
                                        const std::string& group, int timeout_s,
                                        const std::function<Result(comm::ProcessGroup&)>& body) {
  auto store = std::make_shared<comm::InMemoryStore>();
  std::mutex mutex;
  std::vector<std::string> errors;
  std::vector<Result> results(world);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < world; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        auto pg = comm::ProcessGroupGloo::create(
            store, rank, world, {.name = group, .timeout = std::chrono::seconds(timeout_s)},
            comm::GlooOptions::loopback());
        results[rank] = body(*pg);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mutex);
        errors.push_back(fmt::format("rank {}: {}", rank, e.what()));
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (const auto& e : errors) fmt::print(stderr, "{}: {}\n", program, e);
  if (!errors.empty()) std::exit(1);
  return results;
}

// Random token ids (batch, seq) in [0, vocab), a different stream per seed (data parallel: one
// per rank).
inline Tensor random_batch(uint64_t seed, int64_t batch, int64_t seq, int64_t vocab) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> token(0, vocab - 1);
  std::vector<int64_t> ids(batch * seq);
  for (auto& v : ids) v = token(rng);
  return ops::from_vector_i64(ids, {batch, seq});
}

// A timed GPT run's sizes and repetitions, and their flags.
struct GPTRunSettings {
  int64_t n_layer = 4;
  int64_t n_embd = 128;
  int64_t n_head = 4;
  int64_t vocab = 256;
  int64_t seq = 64;
  int64_t batch = 4;  // sequences per rank
  int warmup = 3;
  int iters = 10;
  int timeout_s = 300;

  void add_options(CLI::App& app) {
    app.add_option("--n-layer", n_layer, "GPT layers")->check(CLI::Range(1, 64));
    app.add_option("--n-embd", n_embd, "GPT width")->check(CLI::Range(8, 4096));
    app.add_option("--n-head", n_head, "GPT heads")->check(CLI::Range(1, 64));
    app.add_option("--vocab", vocab, "vocabulary size")->check(CLI::Range(2, 100000));
    app.add_option("--seq", seq, "sequence length (= block_size)")->check(CLI::Range(1, 4096));
    app.add_option("--batch", batch, "sequences per rank")->check(CLI::Range(1, 1024));
    app.add_option("--warmup", warmup, "untimed iterations")->check(CLI::Range(0, 1000));
    app.add_option("--iters", iters, "timed iterations (medians)")->check(CLI::Range(1, 100000));
    app.add_option("--timeout-s", timeout_s, "the groups' operation timeout")
        ->check(CLI::Range(1, 3600));
  }

  // The GPT of these sizes (the context = the sequence), validated.
  models::GPTConfig config() const {
    models::GPTConfig config;
    config.n_layer = n_layer;
    config.n_embd = n_embd;
    config.n_head = n_head;
    config.vocab_size = vocab;
    config.block_size = seq;
    config.validate();
    return config;
  }
};

}  // namespace loom::bench
