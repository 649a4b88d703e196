// `loom plan --search`: choose the layout, not only check it (issue 38's first part). Every
// layout of the world's ranks — tp x pp x dp_shard x dp_replicate, and with a pipeline its
// schedule and microbatches, with and without full activation checkpointing — is checked with
// the job's own rules (the ones `loom plan` and the job apply: heads over tp, layers over the
// stages, the batch over dp x microbatches, ...), the survivors' steps are traced on the meta
// device (train/job_plan.h), those over the memory limit dropped, and the rest ranked by the
// step time the machine model predicts (train/step_time_model.h). Traces run several at once
// (one per core; each traced rank on its own thread, with its own fake groups and memory
// tracker, so traces share nothing) and are kept in a cache (train/trace_cache.h): a search run
// again reads them back and only re-ranks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tensor/device.h"
#include "train/job_config.h"
#include "train/step_time_model.h"
#include "train/trace_cache.h"

namespace loom::train {

struct LayoutSearchOptions {
  int64_t world_size = 1;
  int top = 5;                          // layouts printed in full
  double budget_s = 0;                  // stop tracing after this many seconds (0: none)
  int64_t memory_limit_bytes = 0;       // per rank (0: none)
  std::optional<MachineModel> machine;  // what ranks the layouts (none: by peak memory)
  Device target = Device::cuda();       // whose kernels' allocations the traces follow
  // Traces run at once, each on its own threads (0: one per core of this machine).
  int jobs = 0;
  // Where traces are read back from and kept (none: every layout traced anew).
  TraceCache* cache = nullptr;
};

struct SearchedLayout {
  JobConfig job;       // the base job with this layout's settings
  std::string layout;  // "tp2 pp2 dp_shard1 dp_replicate1 1f1b m4 ac=none"
  std::string pruned;  // why the job's rules reject it; empty: it passed them
  bool traced = false;
  bool from_cache = false;  // its trace was read back from the cache (not traced now)
  int64_t peak_bytes = 0;   // the traced ranks' largest step peak
  double trace_s = 0;       // how long its trace took (0 when read back)
  std::optional<StepTimeEstimate> time;
  bool over_limit = false;  // its traced peak exceeds the memory limit
};

struct LayoutSearch {
  std::vector<SearchedLayout> layouts;  // every candidate, once, in enumeration order
  std::vector<size_t> ranking;          // traced, within memory: best first
  double seconds = 0;
  int jobs = 1;  // traces run at once
  bool budget_ran_out = false;
  std::string cache_dir;          // where traces were read back and kept (empty: none)
  std::string cache_write_error;  // why the cache could not be written (empty: it was)
};

// Every candidate layout of `world_size` ranks for `base` (its model, batch and other settings),
// each once.
std::vector<SearchedLayout> enumerate_layouts(const JobConfig& base, int64_t world_size);

// Checks, traces and ranks them (see above).
LayoutSearch search_layouts(const JobConfig& base, const LayoutSearchOptions& options);

// The top layouts (step time, tokens/s, MFU, peak memory per rank), why the next few lost, how
// many were pruned, traced and over memory, and the job-file lines that run the winner.
std::string format_layout_search(const LayoutSearch& search, const LayoutSearchOptions& options);

}  // namespace loom::train
