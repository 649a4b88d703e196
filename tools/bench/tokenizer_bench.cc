// tokenizer_bench: encoding throughput of loom::data::Tokenizer (Hugging Face tokenizer.json,
// byte-level BPE) on the tokenizer fixtures' mixed text, per core.
//
//   bazel run -c opt //tools/bench:tokenizer_bench
//   bazel run -c opt //tools/bench:tokenizer_bench -- --tokenizers gpt2 --seconds 3 --json
//   python3 tools/bench/tokenizer_throughput.py    # beside HF tokenizers and tiktoken, same run
//
// For each tokenizer (tests/data/fixtures/tokenizer/NAME.json): the ids are checked against
// Hugging Face's (NAME.ids.bin) first; then "cold" is the first encode of the text by a freshly
// loaded tokenizer (its per-thread piece cache empty), "warm" the median of repeated encodes of
// the whole text on one thread (what a long corpus sees once the common pieces are cached), and
// "N threads" the same with N threads each encoding the text at once (MB/s per thread: the
// caches are per thread, so this shows what parallel chunks on N cores get, memory bandwidth and
// all). MB = 10^6 bytes of UTF-8 text.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "data/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  LOOM_CHECK(file.good(), "tokenizer_bench: cannot open {}", path);
  return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

// llm.c's token file (int32[256] header: magic, version, count; uint16 or uint32 ids).
std::vector<int32_t> read_ids(const std::string& path) {
  const std::string bytes = read_file(path);
  int32_t header[256];
  LOOM_CHECK(bytes.size() >= sizeof(header), "tokenizer_bench: {} is too short", path);
  std::memcpy(header, bytes.data(), sizeof(header));
  const size_t width = header[0] == 20240801 ? 4 : 2;
  std::vector<int32_t> ids(static_cast<size_t>(header[2]));
  for (size_t i = 0; i < ids.size(); ++i) {
    uint32_t id = 0;
    std::memcpy(&id, bytes.data() + sizeof(header) + i * width, width);
    ids[i] = static_cast<int32_t>(id);
  }
  return ids;
}

// Median seconds of encoding `text` whole, repeated for at least `budget` seconds (and 3 times).
double median_encode_seconds(const loom::data::Tokenizer& t, const std::string& text,
                             double budget) {
  std::vector<double> times;
  const auto start = Clock::now();
  while (times.size() < 3 || seconds_since(start) < budget) {
    const auto t0 = Clock::now();
    const std::vector<int32_t> ids = t.encode(text);
    times.push_back(seconds_since(t0));
    if (ids.empty()) std::abort();  // keep the work
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Encoding throughput of loom::data::Tokenizer on the tokenizer fixtures' text"};
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  std::string fixtures =
      std::string(workspace ? workspace : ".") + "/tests/data/fixtures/tokenizer";
  std::vector<std::string> names = {"gpt2", "llama3_style", "gpt2_style"};
  std::string text_path;
  double seconds = 2.0;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bool json = false;
  app.add_option("--fixtures", fixtures, "folder of NAME.json, NAME.ids.bin and text.txt");
  app.add_option("--tokenizers", names, "fixture names");
  app.add_option("--text", text_path, "text to encode (default: FIXTURES/text.txt; no id check)");
  app.add_option("--seconds", seconds, "timed seconds per measurement")
      ->check(CLI::Range(0.01, 600.0));
  app.add_option("--threads", threads, "threads of the parallel measurement")
      ->check(CLI::Range(1, 1024));
  app.add_flag("--json", json, "one JSON object per tokenizer instead of the table");
  CLI11_PARSE(app, argc, argv);

  const bool fixture_text = text_path.empty();
  const std::string text = read_file(fixture_text ? fixtures + "/text.txt" : text_path);
  const double mb = static_cast<double>(text.size()) / 1e6;
  if (!json) {
    fmt::print("tokenizer_bench: {:.3f} MB of text ({}), {} hardware threads; MB/s = 1e6 bytes/s\n",
               mb, fixture_text ? "the fixtures' text.txt" : text_path,
               std::thread::hardware_concurrency());
    fmt::print("{:<14} {:>8} {:>10} {:>11} {:>11} {:>22}  {}\n", "tokenizer", "load ms", "ids",
               "cold MB/s", "warm MB/s", fmt::format("{} threads MB/s/thread", threads),
               "ids = HF");
  }
  for (const std::string& name : names) {
    const auto load_start = Clock::now();
    const loom::data::Tokenizer t =
        loom::data::Tokenizer::from_file(fixtures + "/" + name + ".json");
    const double load_s = seconds_since(load_start);
    const auto cold_start = Clock::now();
    const std::vector<int32_t> ids = t.encode(text);
    const double cold_s = seconds_since(cold_start);
    std::string match = "-";
    if (fixture_text) {
      match = ids == read_ids(fixtures + "/" + name + ".ids.bin") ? "yes" : "NO";
    }
    const double warm_s = median_encode_seconds(t, text, seconds);
    std::vector<double> per_thread(threads);
    std::vector<std::thread> workers;
    for (int k = 0; k < threads; ++k) {
      workers.emplace_back([&, k] { per_thread[k] = median_encode_seconds(t, text, seconds); });
    }
    for (auto& w : workers) w.join();
    double parallel = 0;
    for (double s : per_thread) parallel += mb / s;
    parallel /= threads;
    if (json) {
      fmt::print(
          "{{\"tokenizer\": \"{}\", \"bytes\": {}, \"ids\": {}, \"load_ms\": {:.1f}, "
          "\"cold_mb_s\": {:.2f}, \"warm_mb_s\": {:.2f}, \"threads\": {}, "
          "\"parallel_mb_s_per_thread\": {:.2f}, \"ids_match_hf\": \"{}\"}}\n",
          name, text.size(), ids.size(), load_s * 1e3, mb / cold_s, mb / warm_s, threads, parallel,
          match);
    } else {
      fmt::print("{:<14} {:>8.1f} {:>10} {:>11.2f} {:>11.2f} {:>22.2f}  {}\n", name, load_s * 1e3,
                 ids.size(), mb / cold_s, mb / warm_s, parallel, match);
    }
  }
  return 0;
}
