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

namespace loom::train {

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

nlohmann::json to_json(const TracedRank& t) {
  nlohmann::json collectives = nlohmann::json::object();
  for (const auto& [group, counters] : t.collectives) {
    collectives[group] = {{"calls", counters.calls}, {"bytes", counters.bytes}};
  }
  return {{"rank", t.rank},
          {"coordinate", t.coordinate},
          {"parameters", t.parameters},
          {"held_bytes", t.held_bytes},
          {"peak_bytes", t.peak_bytes},
          {"construction_peak_bytes", t.construction_peak_bytes},
          {"flops", t.flops},
          {"recompute_flops", t.recompute_flops},
          {"allocations", t.allocations},
          {"allocated_bytes", t.allocated_bytes},
          {"step_ms", t.step_ms},
          {"collectives", collectives},
          {"validation_peak_bytes", t.validation_peak_bytes},
          {"validation_flops", t.validation_flops}};
}

TracedRank from_json(const nlohmann::json& j) {
  TracedRank t;
  j.at("rank").get_to(t.rank);
  j.at("coordinate").get_to(t.coordinate);
  j.at("parameters").get_to(t.parameters);
  j.at("held_bytes").get_to(t.held_bytes);
  j.at("peak_bytes").get_to(t.peak_bytes);
  j.at("construction_peak_bytes").get_to(t.construction_peak_bytes);
  j.at("flops").get_to(t.flops);
  j.at("recompute_flops").get_to(t.recompute_flops);
  j.at("allocations").get_to(t.allocations);
  j.at("allocated_bytes").get_to(t.allocated_bytes);
  j.at("step_ms").get_to(t.step_ms);
  for (const auto& [group, counters] : j.at("collectives").items()) {
    comm::CollectiveCounters& c = t.collectives[group];
    counters.at("calls").get_to(c.calls);
    counters.at("bytes").get_to(c.bytes);
  }
  j.at("validation_peak_bytes").get_to(t.validation_peak_bytes);
  j.at("validation_flops").get_to(t.validation_flops);
  return t;
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
    std::vector<TracedRank> traced;
    for (const nlohmann::json& rank : entry.at("traced")) traced.push_back(from_json(rank));
    return traced;
  } catch (const std::exception&) {
    return std::nullopt;  // torn or foreign: traced again, then rewritten
  }
}

void TraceCache::store(const std::string& key, const std::vector<TracedRank>& traced) {
  if (dir_.empty()) return;
  nlohmann::json entry{{"format", kFormat}, {"traced", nlohmann::json::array()}};
  for (const TracedRank& t : traced) entry["traced"].push_back(to_json(t));
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
