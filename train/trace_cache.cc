#include "train/trace_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/cache_dir.h"
#include "base/durable_file.h"
#include "base/error.h"
#include "checkpoint/sha256.h"

// TracedRank as JSON, field by field (nlohmann's own macros: a field added to the struct and
// here is stored and read alike).
namespace loom::comm {
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(CollectiveCounters, calls, bytes)
}  // namespace loom::comm

namespace loom::train {

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(TracedRank, rank, coordinate, parameters, held_bytes, peak_bytes,
                                   construction_peak_bytes, flops, recompute_flops, allocations,
                                   allocated_bytes, in_place_bytes, step_ms, collectives,
                                   validation_peak_bytes, validation_flops)

namespace fs = std::filesystem;

namespace {

constexpr int kFormat = 2;  // bump when TracedRank's stored fields change

// The running binary's SHA-256 (what its code is), read once.
const std::string& this_binary_sha256() {
  static const std::string digest = [] {
    std::ifstream exe("/proc/self/exe", std::ios::binary);
    checkpoint::Sha256 hash;
    std::vector<char> buffer(1 << 20);
    while (exe.read(buffer.data(), static_cast<std::streamsize>(buffer.size())) ||
           exe.gcount() > 0) {
      hash.update(buffer.data(), static_cast<size_t>(exe.gcount()));
    }
    return hash.hex();
  }();
  return digest;
}

// Keeps the newest `keep` build folders under `root` besides `current`.
void remove_older_builds(const fs::path& root, const fs::path& current, size_t keep) {
  std::error_code ec;
  std::vector<std::pair<fs::file_time_type, fs::path>> builds;
  for (const fs::directory_entry& entry : fs::directory_iterator(root, ec)) {
    if (entry.is_directory(ec) && entry.path() != current) {
      builds.emplace_back(entry.last_write_time(ec), entry.path());
    }
  }
  if (builds.size() <= keep) return;
  std::sort(builds.begin(), builds.end(), [](const auto& a, const auto& b) { return a > b; });
  for (size_t i = keep; i < builds.size(); ++i) fs::remove_all(builds[i].second, ec);
}

}  // namespace

TraceCache::TraceCache(std::string dir) : dir_(std::move(dir)) {}

TraceCache TraceCache::for_this_binary() {
  return TraceCache((fs::path(loom_cache_dir()) / "plan_traces" / this_binary_sha256()).string());
}

std::string TraceCache::key(std::string_view identity) {
  const std::string text = fmt::format("loom trace cache {}\n{}", kFormat, identity);
  return checkpoint::sha256_hex(text.data(), text.size());
}

std::optional<std::vector<TracedRank>> TraceCache::load(const std::string& key) const {
  if (dir_.empty()) return std::nullopt;
  std::ifstream in(fs::path(dir_) / (key + ".json"));
  if (!in) return std::nullopt;
  try {
    const nlohmann::json entry = nlohmann::json::parse(in);
    return entry.at("traced").get<std::vector<TracedRank>>();
  } catch (const std::exception&) {
    return std::nullopt;  // torn or foreign: traced again, then rewritten
  }
}

void TraceCache::store(const std::string& key, const std::vector<TracedRank>& traced) {
  if (dir_.empty()) return;
  const nlohmann::json entry{{"format", kFormat}, {"traced", traced}};
  try {
    std::error_code ec;
    const fs::path dir(dir_);
    if (!fs::exists(dir, ec)) {
      // Another thread of the search may make it at the same moment: what counts is that it is.
      fs::create_directories(dir, ec);
      LOOM_CHECK(fs::is_directory(dir, ec), "cannot make the folder '{}': {}", dir_,
                 ec ? ec.message() : "it is not a folder");
      remove_older_builds(dir.parent_path(), dir, /*keep=*/4);
    }
    write_file_atomically((dir / (key + ".json")).string(), entry.dump() + "\n",
                          "the plan's trace cache");
  } catch (const PathBusyError&) {
    // Another search writing the same entry at this moment: the same trace, kept by it.
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (write_error_.empty()) write_error_ = e.what();
  }
}

std::string TraceCache::write_error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return write_error_;
}

}  // namespace loom::train
