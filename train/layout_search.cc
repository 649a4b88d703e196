#include "train/layout_search.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <set>
#include <thread>

#include "base/error.h"
#include "train/job_checks.h"
#include "train/job_plan.h"

namespace loom::train {

namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

std::string describe(const JobConfig& job) {
  std::string out = fmt::format("tp{} pp{} dp_shard{} dp_replicate{}", job.tp, job.pp, job.dp_shard,
                                job.dp_replicate);
  if (job.pp > 1) out += fmt::format(" {} m{}", job.schedule, job.microbatches);
  out += fmt::format(" ac={}", job.activation_checkpoint);
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

std::vector<SearchedLayout> enumerate_layouts(const JobConfig& base, int64_t world_size) {
  LOOM_CHECK(world_size >= 1, "loom plan --search: needs at least 1 rank, got {}", world_size);
  std::vector<SearchedLayout> out;
  std::set<std::string> seen;
  for (int64_t tp : divisors(world_size)) {
    for (int64_t pp : divisors(world_size / tp)) {
      const int64_t rest = world_size / (tp * pp);
      for (int64_t dp_shard : divisors(rest)) {
        // Pipelines: the schedules with one stage per rank, at pp and 2 pp microbatches.
        std::vector<std::pair<std::string, int64_t>> pipelines = {{"1f1b", 0}};
        if (pp > 1) pipelines = {{"1f1b", pp}, {"1f1b", 2 * pp}, {"zb-h1", pp}, {"zb-h1", 2 * pp}};
        for (const auto& [schedule, microbatches] : pipelines) {
          for (const char* checkpointing : {"none", "full"}) {
            JobConfig job = base;
            job.tp = tp;
            job.pp = pp;
            job.dp = 0;
            job.dp_shard = dp_shard;
            job.dp_replicate = rest / dp_shard;
            job.cp = 1;
            job.ep = 1;
            job.schedule = schedule;
            job.microbatches = microbatches;
            job.virtual_stages = 1;
            job.grad_accum = 1;
            job.activation_checkpoint = checkpointing;
            const std::string layout = describe(job);
            if (seen.insert(layout).second) out.push_back({.job = job, .layout = layout});
          }
        }
      }
    }
  }
  return out;
}

namespace {

// Everything a layout's trace depends on, as text (the cache's key): the candidate job with the
// settings that cannot change its step cleared (the search's and the plan's own, the outputs),
// the model as the job built it, the device whose allocations it follows, the world.
std::string trace_identity(const JobConfig& candidate, const models::ModelArgs& model,
                           const LayoutSearchOptions& options, const PlanOptions& plan) {
  JobConfig job = candidate;
  job.search = false;
  job.search_top = 0;
  job.search_budget_s = job.search_memory_gib = 0;
  job.plan_rank_tflops = job.plan_link_gbps = job.plan_latency_us = job.plan_peak_tflops =
      job.plan_memory_gbps = 0;
  job.plan_dim_link_gbps.clear();
  job.metrics_out.clear();
  job.plot_out.clear();
  job.progress = false;
  job.log_every = 1;
  return fmt::format("{}\nmodel {}\n{}\ntarget {} world {} traced at most {}\n", to_toml(job),
                     model.summary(), model.fields().dump(), options.target.str(),
                     options.world_size, plan.max_traced_ranks);
}

// Traces one candidate (or reads its trace back) and fills in its peak and time.
void trace_candidate(SearchedLayout& candidate, const ParallelConfig& parallel,
                     const models::ModelArgs& model, const LayoutSearchOptions& options) {
  const PlanOptions plan_options{.machine = options.machine, .target = options.target};
  const std::string key =
      options.cache != nullptr
          ? TraceCache::key(trace_identity(candidate.job, model, options, plan_options))
          : std::string();
  std::optional<std::vector<TracedRank>> traced;
  if (options.cache != nullptr) traced = options.cache->load(key);
  if (traced) {
    candidate.from_cache = true;
  } else {
    const auto traced_at = std::chrono::steady_clock::now();
    JobPlan plan;
    try {
      plan =
          plan_job(model, parallel, candidate.job.batch_size, candidate.job.seq_len, plan_options);
    } catch (const Error& e) {
      // The job's own code failed on this layout: it would fail the real job too.
      candidate.pruned = fmt::format("its traced step failed: {}", e.what());
      return;
    }
    candidate.trace_s = seconds_since(traced_at);
    traced = std::move(plan.traced);
    if (options.cache != nullptr) options.cache->store(key, *traced);
  }
  candidate.traced = true;
  for (const TracedRank& t : *traced) {
    candidate.peak_bytes = std::max(candidate.peak_bytes, t.peak_bytes);
  }
  if (options.machine) {
    candidate.time =
        estimate_step_time(*traced, parallel, candidate.job.batch_size * candidate.job.seq_len,
                           options.world_size, *options.machine);
  }
  candidate.over_limit =
      options.memory_limit_bytes > 0 && candidate.peak_bytes > options.memory_limit_bytes;
}

}  // namespace

LayoutSearch search_layouts(const JobConfig& base, const LayoutSearchOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  // The model (and the data, paths, ...) are the base job's whatever the layout: checked once.
  const CheckedJob checked = check_job(base);
  const models::ModelArgs& model = *checked.model.args;
  LayoutSearch search{.layouts = enumerate_layouts(base, options.world_size)};
  // The job's own layout rules first (no trace, cheap): what the job itself would reject.
  std::vector<std::pair<size_t, ParallelConfig>> to_trace;
  for (size_t i = 0; i < search.layouts.size(); ++i) {
    SearchedLayout& candidate = search.layouts[i];
    try {
      ParallelConfig parallel = parallel_config(candidate.job);
      plan_job(model, parallel, candidate.job.batch_size, candidate.job.seq_len,
               PlanOptions{.trace = false, .target = options.target});
      to_trace.emplace_back(i, std::move(parallel));
    } catch (const Error& e) {
      candidate.pruned = e.what();
    }
  }
  // Then the traces, several at once: each worker takes the next candidate until none is left
  // or the budget has run out.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  search.jobs = static_cast<int>(
      std::min<size_t>(options.jobs > 0 ? static_cast<size_t>(options.jobs) : cores,
                       std::max<size_t>(1, to_trace.size())));
  std::atomic<size_t> next{0};
  std::atomic<bool> budget_ran_out{false};
  std::mutex failure_mutex;
  std::exception_ptr failure;  // anything but a loom::Error: not the layout's fault
  const auto work = [&] {
    for (size_t n; (n = next.fetch_add(1)) < to_trace.size();) {
      if (options.budget_s > 0 && seconds_since(start) > options.budget_s) {
        budget_ran_out = true;
        continue;  // the rest are counted as untraced
      }
      auto& [index, parallel] = to_trace[n];
      try {
        trace_candidate(search.layouts[index], parallel, model, options);
      } catch (...) {
        std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failure) failure = std::current_exception();
      }
    }
  };
  std::vector<std::thread> workers;
  for (int w = 1; w < search.jobs; ++w) workers.emplace_back(work);
  work();
  for (std::thread& worker : workers) worker.join();
  if (failure) std::rethrow_exception(failure);
  search.budget_ran_out = budget_ran_out;
  if (options.cache != nullptr) {
    search.cache_dir = options.cache->dir();
    search.cache_write_error = options.cache->write_error();
  }
  for (size_t i = 0; i < search.layouts.size(); ++i) {
    const SearchedLayout& c = search.layouts[i];
    if (c.traced && !c.over_limit) search.ranking.push_back(i);
  }
  std::stable_sort(search.ranking.begin(), search.ranking.end(), [&](size_t a, size_t b) {
    const SearchedLayout &x = search.layouts[a], &y = search.layouts[b];
    if (x.time && y.time) return x.time->step_ms < y.time->step_ms;
    return x.peak_bytes < y.peak_bytes;  // no machine model: the least memory first
  });
  search.seconds = seconds_since(start);
  return search;
}

std::string format_layout_search(const LayoutSearch& search, const LayoutSearchOptions& options) {
  int pruned = 0, traced = 0, reused = 0, over = 0;
  double trace_s = 0;
  for (const SearchedLayout& c : search.layouts) {
    pruned += !c.pruned.empty();
    traced += c.traced && !c.from_cache;
    reused += c.from_cache;
    over += c.over_limit;
    trace_s += c.trace_s;
  }
  std::string out = fmt::format(
      "loom plan --search: {} layouts of {} ranks: {} rejected by the job's rules, {} traced{}, "
      "{} read back from the trace cache, {} over the memory limit{}; {:.1f} s in all{}\n",
      search.layouts.size(), options.world_size, pruned, traced,
      traced > 0 ? fmt::format(" ({:.0f} ms each on average, {} at once)", 1000 * trace_s / traced,
                               search.jobs)
                 : std::string(),
      reused, over,
      options.memory_limit_bytes > 0
          ? fmt::format(" of {:.1f} MiB per rank", options.memory_limit_bytes / 1048576.0)
          : std::string(),
      search.seconds,
      search.budget_ran_out
          ? " (the budget ran out: some were not traced; run again to go on from the cache)"
          : "");
  if (!search.cache_dir.empty()) {
    out += fmt::format("traces kept in {}{}\n", search.cache_dir,
                       search.cache_write_error.empty()
                           ? std::string()
                           : fmt::format(" (could not write it: {})", search.cache_write_error));
  }
  if (search.ranking.empty()) return out + "no layout fits\n";
  out += fmt::format(
      "\n| rank | layout | step ms | tokens/s | MFU | peak MiB per rank |\n"
      "|---:|---|---:|---:|---:|---:|\n");
  const size_t shown = std::min<size_t>(search.ranking.size(), static_cast<size_t>(options.top));
  for (size_t r = 0; r < shown; ++r) {
    const SearchedLayout& c = search.layouts[search.ranking[r]];
    out += fmt::format("| {} | {} | {} | {} | {} | {:.1f} |\n", r + 1, c.layout,
                       c.time ? fmt::format("{:.1f}", c.time->step_ms) : "-",
                       c.time ? fmt::format("{:.0f}", c.time->tokens_per_s) : "-",
                       c.time && c.time->mfu > 0 ? fmt::format("{:.1f} %", 100 * c.time->mfu) : "-",
                       c.peak_bytes / 1048576.0);
  }
  // Why the next few lost against the winner: the largest of their differences.
  const SearchedLayout& best = search.layouts[search.ranking.front()];
  if (best.time) {
    std::string lost;
    for (size_t r = shown; r < std::min(search.ranking.size(), shown + 3); ++r) {
      const SearchedLayout& c = search.layouts[search.ranking[r]];
      if (!c.time) continue;
      const double compute =
          c.time->compute_ms * c.time->bubble - best.time->compute_ms * best.time->bubble;
      const double comm = c.time->exposed_comm_ms - best.time->exposed_comm_ms;
      const double bubble = (c.time->bubble - 1) * (c.time->compute_ms + c.time->exposed_comm_ms);
      const char* why = comm >= compute && comm >= bubble ? "exposed communication"
                        : bubble >= compute               ? "the pipeline bubble"
                                                          : "compute (and recompute)";
      lost += fmt::format("  {}: {:.1f} ms, lost on {} (+{:.1f} ms)\n", c.layout, c.time->step_ms,
                          why, c.time->step_ms - best.time->step_ms);
    }
    if (!lost.empty()) out += "\nThe next ones:\n" + lost;
  }
  out += fmt::format(
      "\nThe winner's job-file lines:\n\n[parallel]\ntp = {}\npp = {}\ndp_replicate = {}\n"
      "dp_shard = {}\n",
      best.job.tp, best.job.pp, best.job.dp_replicate, best.job.dp_shard);
  if (best.job.pp > 1) {
    out += fmt::format("schedule = \"{}\"\nmicrobatches = {}\n", best.job.schedule,
                       best.job.microbatches);
  }
  out +=
      fmt::format("\n[training]\nactivation_checkpoint = \"{}\"\n", best.job.activation_checkpoint);
  return out;
}

}  // namespace loom::train
