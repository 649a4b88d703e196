// A token corpus's costs (data/token_corpus.h): opening it, the range check over every token
// (GB/s), and reading a step's batch from the memory-mapped shards against the same number of
// tokens held in memory (microseconds per batch; interleaved rounds, median and range).
//
//   bazel run -c opt //tools/bench:corpus_bench -- --data 'big/*.bin' --batch 8 --seq-len 1024
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "data/token_corpus.h"
#include "data/token_data.h"
#include "tensor/tensor.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

long resident_kib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

// Microseconds per batch over `steps` steps.
double batch_us(const loom::data::TokenCorpus& corpus, int steps, int first_step, int64_t batch,
                int64_t seq_len) {
  const auto start = Clock::now();
  for (int step = first_step; step < first_step + steps; ++step) {
    const auto b = loom::data::batch_slice(corpus, 1, step, 0, batch, seq_len);
    if (b.inputs.numel() != batch * seq_len) std::abort();
  }
  return seconds_since(start) * 1e6 / steps;
}

}  // namespace

int main(int argc, char** argv) {
  std::string spec;
  int64_t batch = 8, seq_len = 1024;
  int steps = 200, rounds = 5;
  CLI::App app{"token corpus: open, range check, batch reads (mapped vs in memory)"};
  app.add_option("--data", spec, "the corpus (as --data)")->required();
  app.add_option("--batch", batch, "sequences per batch")->capture_default_str();
  app.add_option("--seq-len", seq_len, "tokens per sequence")->capture_default_str();
  app.add_option("--steps", steps, "batches per round")->capture_default_str();
  app.add_option("--rounds", rounds, "interleaved rounds")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const long rss_before = resident_kib();
  auto start = Clock::now();
  const loom::data::TokenCorpus mapped = loom::data::TokenCorpus::open(spec);
  const double open_s = seconds_since(start);
  start = Clock::now();
  mapped.check_tokens_below(mapped.vocab_size(), "--data");
  const double scan_s = seconds_since(start);
  const long rss_after_scan = resident_kib();
  // The in-memory corpus: as many tokens as one round reads at most, plus a window.
  const int64_t held = std::min<int64_t>(mapped.size(), int64_t{1} << 24);
  std::vector<int64_t> wide(static_cast<size_t>(held));
  mapped.read(0, held, wide.data());
  const loom::data::TokenCorpus memory = loom::data::TokenCorpus::from_tokens(
      std::vector<int32_t>(wide.begin(), wide.end()), mapped.vocab_size(), "in memory");
  std::vector<double> mapped_us, memory_us;
  for (int r = 0; r < rounds; ++r) {  // interleaved pairs, fresh steps each round
    mapped_us.push_back(batch_us(mapped, steps, r * steps, batch, seq_len));
    memory_us.push_back(batch_us(memory, steps, r * steps, batch, seq_len));
  }
  std::vector<double> ratio;
  for (int r = 0; r < rounds; ++r) ratio.push_back(mapped_us[r] / memory_us[r]);
  std::sort(mapped_us.begin(), mapped_us.end());
  std::sort(memory_us.begin(), memory_us.end());
  std::sort(ratio.begin(), ratio.end());
  const double bytes = static_cast<double>(mapped.size()) * (mapped.vocab_size() > 65536 ? 4 : 2);
  std::printf("corpus: %s\n", mapped.description().c_str());
  std::printf("open: %.3f s; range check: %.2f s, %.2f GB/s; resident %ld -> %ld KiB\n", open_s,
              scan_s, bytes / scan_s / 1e9, rss_before, rss_after_scan);
  std::printf(
      "batch of %lld x %lld: mapped %.1f us (%.1f-%.1f), in memory %.1f us (%.1f-%.1f), "
      "mapped/memory %.2fx (%.2f-%.2f), %d rounds of %d batches; resident at the end %ld KiB\n",
      static_cast<long long>(batch), static_cast<long long>(seq_len), mapped_us[rounds / 2],
      mapped_us.front(), mapped_us.back(), memory_us[rounds / 2], memory_us.front(),
      memory_us.back(), ratio[rounds / 2], ratio.front(), ratio.back(), rounds, steps,
      resident_kib());
  return 0;
}
