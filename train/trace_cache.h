// Traced steps kept between `loom plan --search` runs. A layout's trace depends only on what the
// job's step is made of (the model, the layout's settings, the batch and sequence, the device
// whose allocations it follows) and on Loom's own code; searched again (another memory limit,
// other machine figures, another --search-top, a budget that ran out before) it is read back
// instead of traced. Entries live in loom_cache_dir()/plan_traces/<this binary's SHA-256>/, one
// JSON file per key, so a rebuilt Loom never reads what an older build traced; the folders of
// other builds beyond the newest four are removed when a new one is made.
#pragma once

#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "train/step_trace.h"

namespace loom::train {

class TraceCache {
 public:
  // No cache: every lookup misses, nothing is written.
  TraceCache() = default;
  // The cache in `dir` (created on the first store).
  explicit TraceCache(std::string dir);
  // loom_cache_dir()/plan_traces/<the running binary's SHA-256>.
  static TraceCache for_this_binary();

  // A SHA-256 over `identity`: everything the trace depends on, as text.
  static std::string key(std::string_view identity);

  // The traced ranks stored under `key`; nullopt when there are none (or the entry does not
  // read back whole: it is traced again and rewritten).
  std::optional<std::vector<TracedRank>> load(const std::string& key) const;
  // Writes them atomically. A cache that cannot be written is not the job's failure: the first
  // reason is kept (write_error) and the search goes on without it. Thread-safe.
  void store(const std::string& key, const std::vector<TracedRank>& traced);

  const std::string& dir() const { return dir_; }
  std::string write_error() const;

 private:
  std::string dir_;
  mutable std::mutex mutex_;
  std::string write_error_;
};

}  // namespace loom::train
