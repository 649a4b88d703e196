// `loom plan --search`: choose the layout, not only check it. Every layout of the world's ranks —
// tp x pp x dp_shard x dp_replicate (x cp, x ep where asked), with a pipeline its schedule (1F1B,
// ZB-H1, interleaved 1F1B over 2 stages per rank, ZBV, DualPipeV) at pp and 2 pp microbatches,
// with no, selective (per op) or full activation checkpointing — is checked with the job's own
// rules (the ones `loom plan` and the job apply: heads over tp, layers over the stages, the batch
// over dp x microbatches, ...); a layout whose model states alone (sized from shapes) exceed the
// memory limit is dropped untraced (the job's grad_accum, and its cp without --search-cp, are
// kept: they are part of its step); the others' steps are traced on the meta device
// (train/job_plan.h), those over the memory limit dropped, and the rest ranked by the step time
// the machine model predicts (train/step_time_model.h).
//
// Bounded: layouts that differ only in how dp splits into dp_shard x dp_replicate and in the
// schedule within one stage placement run the same matrix products on every rank, so one traced
// layout of each such class gives the others' compute FLOPs. A layout's step is at least its
// slowest rank's FLOPs at the machine's rate times its schedule's bubble (communication, memory-
// bound ops and overheads only add); a layout whose bound is no better than the best traced
// step within the limit cannot win and is not traced. The rest are traced in order of their
// bound, several at once (each traced rank on its own thread, with its own fake groups and
// memory tracker, so traces share nothing), and kept in a cache (train/trace_cache.h): a search
// run again reads them back and only re-ranks.
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

// What the search varies besides tp, pp, dp_shard, dp_replicate, the schedules and checkpointing.
struct LayoutSpace {
  bool cp = false;  // context parallelism (long sequences) over the divisors too (else the job's)
  bool ep = false;  // expert parallelism (MoE models): ep over the divisors of dp_shard x cp
};

struct LayoutSearchOptions {
  int64_t world_size = 1;
  int top = 5;                          // layouts printed in full
  double budget_s = 0;                  // stop tracing after this many seconds (0: none)
  int64_t memory_limit_bytes = 0;       // per rank (0: none)
  std::optional<MachineModel> machine;  // what ranks the layouts (none: by peak memory)
  Device target = Device::cuda();       // whose kernels' allocations the traces follow
  LayoutSpace space;
  // Skip the layouts whose lower bound cannot beat the best (with a machine model).
  bool bound = true;
  // Traces run at once, each on its own threads (0: one per core of this machine).
  int jobs = 0;
  // Where traces are read back from and kept (none: every layout traced anew).
  TraceCache* cache = nullptr;
};

struct SearchedLayout {
  JobConfig job;       // the base job with this layout's settings
  std::string layout;  // "tp2 pp2 dp_shard1 dp_replicate1 1f1b m4 ac=none"
  std::string pruned;  // why the job's rules reject it; empty: it passed them
  // The most any rank holds in parameters, gradients and AdamW's moments (from shapes; 0 for a
  // family that does not list its parameters).
  int64_t model_state_bytes = 0;
  // Why a layout the rules accept was not traced: its model states exceed the memory limit, or
  // its lower bound cannot beat the best; empty when it was traced (or the budget ran out).
  std::string not_traced;
  double lower_bound_ms = 0;  // its step's lower bound (0: none computed)
  bool traced = false;
  bool from_cache = false;     // its trace was read back from the cache (not traced now)
  int64_t peak_bytes = 0;      // the traced ranks' largest step peak
  int64_t max_rank_flops = 0;  // the traced ranks' largest step FLOPs
  double trace_s = 0;          // how long its trace took (0 when read back)
  std::optional<StepTimeEstimate> time;
  bool over_limit = false;  // its traced peak (or its model states alone) exceed the limit
};

struct LayoutSearch {
  std::vector<SearchedLayout> layouts;  // every candidate, once, in enumeration order
  std::vector<size_t> ranking;          // traced, within memory: best first
  double seconds = 0;
  int jobs = 1;  // traces run at once
  bool budget_ran_out = false;
  std::string cache_dir;          // where traces were read back and kept (empty: none)
  std::string cache_write_error;  // why the cache could not be written (empty: it was)
  // How the model's training depends on the layout (ModelArgs::layout_dependence: a mixture of
  // experts' balancing), said beside the ranking: the layouts are not all the same training.
  std::string layout_dependence;
};

// The ranks a search lays out: --nproc when given, else the product of the job's degrees (the
// layout on the command line, which the search replaces, says only how many ranks there are).
int64_t search_world_size(const JobConfig& job);

// The job on one rank, without its layout (every degree 1, no pipeline options, no --nproc):
// what check_job checks of a search's base (model, data, paths, flags), since the layout on its
// command line is the one the search replaces. Each candidate is pruned by its ParallelConfig,
// stage split and trace (its model's layout checks, such as tp dividing the heads, fail there).
JobConfig without_layout(const JobConfig& job);

// Every candidate layout of `world_size` ranks for `base` (its model, batch and other settings),
// each once.
std::vector<SearchedLayout> enumerate_layouts(const JobConfig& base, int64_t world_size,
                                              const LayoutSpace& space = {});

// Checks, bounds, traces and ranks them (see above).
LayoutSearch search_layouts(const JobConfig& base, const LayoutSearchOptions& options);

// The top layouts (step time, tokens/s, MFU, peak memory per rank), why the next few lost, how
// many were pruned, traced, bounded out and over memory, and the job-file lines that run the
// winner.
std::string format_layout_search(const LayoutSearch& search, const LayoutSearchOptions& options);

}  // namespace loom::train
