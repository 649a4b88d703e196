#include "train/layout_search.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "base/error.h"
#include "parallel/pipeline/schedules.h"
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
  if (job.cp > 1) out += fmt::format(" cp{}", job.cp);
  if (job.ep > 1) out += fmt::format(" ep{}", job.ep);
  if (job.pp > 1) {
    out += " " + job.schedule;
    if (job.virtual_stages > 1) out += fmt::format(" v{}", job.virtual_stages);
    out += fmt::format(" m{}", job.microbatches);
  }
  out += fmt::format(" ac={}", job.activation_checkpoint);
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct Pipeline {
  const char* schedule;
  int64_t microbatches;
  int64_t virtual_stages;
};

// With a pipeline: each schedule at pp and 2 pp microbatches (DualPipeV needs 2 pp); interleaved
// over 2 stages per rank; the V schedules place 2 stages per rank themselves.
std::vector<Pipeline> pipelines(int64_t pp) {
  if (pp == 1) return {{"1f1b", 0, 1}};
  return {{"1f1b", pp, 1},      {"1f1b", 2 * pp, 1},    {"zb-h1", pp, 1},
          {"zb-h1", 2 * pp, 1}, {"interleaved", pp, 2}, {"interleaved", 2 * pp, 2},
          {"zbv", pp, 1},       {"zbv", 2 * pp, 1},     {"dualpipev", 2 * pp, 1}};
}

}  // namespace

int64_t search_world_size(const JobConfig& job) {
  return job.nproc > 0 ? job.nproc : parallel_config(job).dims.world_size();
}

JobConfig without_layout(const JobConfig& job) {
  JobConfig one = job;
  const JobConfig defaults;
  one.tp = one.pp = one.cp = one.ep = 1;
  one.dp = 0;
  one.dp_replicate = one.dp_shard = 1;
  one.nproc = 0;
  one.schedule = defaults.schedule;
  one.microbatches = defaults.microbatches;
  one.virtual_stages = defaults.virtual_stages;
  one.layers_per_stage = defaults.layers_per_stage;
  one.cp_attention = defaults.cp_attention;
  return one;
}

std::vector<SearchedLayout> enumerate_layouts(const JobConfig& base, int64_t world_size,
                                              const LayoutSpace& space) {
  LOOM_CHECK(world_size >= 1, "loom plan --search: needs at least 1 rank, got {}", world_size);
  std::vector<SearchedLayout> out;
  std::set<std::string> seen;
  for (int64_t tp : divisors(world_size)) {
    for (int64_t pp : divisors(world_size / tp)) {
      // Without --search-cp the job's own cp (1 unless it gave one), where it divides the rest.
      std::vector<int64_t> cps;
      if (space.cp) {
        cps = divisors(world_size / (tp * pp));
      } else if (base.cp >= 1 && (world_size / (tp * pp)) % base.cp == 0) {
        cps = {base.cp};
      }
      for (int64_t cp : cps) {
        const int64_t rest = world_size / (tp * pp * cp);
        for (int64_t dp_shard : divisors(rest)) {
          for (int64_t ep : space.ep ? divisors(dp_shard * cp) : std::vector<int64_t>{1}) {
            for (const Pipeline& pipeline : pipelines(pp)) {
              for (const char* checkpointing : {"none", "selective-op", "full"}) {
                JobConfig job = base;
                job.tp = tp;
                job.pp = pp;
                job.cp = cp;
                job.dp = 0;
                job.dp_shard = dp_shard;
                job.dp_replicate = rest / dp_shard;
                job.ep = ep;
                job.schedule = pipeline.schedule;
                job.microbatches = pipeline.microbatches;
                job.virtual_stages = pipeline.virtual_stages;
                job.layers_per_stage.clear();  // the search splits each pipeline evenly
                job.nproc = 0;  // the degrees make the ranks (and --nproc N searches share traces)
                // grad_accum is the job's: it splits each optimizer step's batch, so it decides
                // the peak and which microbatch counts divide; a layout it does not fit is pruned
                // with the job's own message.
                job.activation_checkpoint = checkpointing;
                const std::string layout = describe(job);
                if (seen.insert(layout).second) out.push_back({.job = job, .layout = layout});
              }
            }
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
  job.search = job.search_cp = job.search_ep = job.search_bound = job.search_cache = false;
  job.search_top = job.search_jobs = 0;
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

// Traces one candidate (or reads its trace back) and fills in its peak, FLOPs and time.
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
    candidate.max_rank_flops = std::max(candidate.max_rank_flops, t.flops);
  }
  if (options.machine) {
    candidate.time =
        estimate_step_time(*traced, parallel, candidate.job.batch_size * candidate.job.seq_len,
                           options.world_size, *options.machine);
  }
  candidate.over_limit =
      options.memory_limit_bytes > 0 && candidate.peak_bytes > options.memory_limit_bytes;
}

// Layouts whose ranks run the same matrix products: all but the dp split and the schedule within
// one stage placement (with MoE also the microbatches: an expert's capacity is per microbatch).
std::string compute_class(const JobConfig& job, bool moe) {
  const int stages =
      pipeline::stages_per_rank_of(job.schedule, static_cast<int>(job.virtual_stages));
  const std::string_view placement =
      job.pp > 1 ? pipeline::placement_name(pipeline::placement_of(job.schedule)) : "";
  return fmt::format("tp{} pp{} cp{} ep{} dp{} ac={} stages{} {}{}", job.tp, job.pp, job.cp, job.ep,
                     job.dp_shard * job.dp_replicate, job.activation_checkpoint, stages, placement,
                     moe ? fmt::format(" m{}", job.microbatches) : "");
}

// Runs `work(i)` for i in [0, n) on `jobs` threads (this one among them), each taking the next;
// rethrows the first exception `work` let through (a layout's own failures it records itself).
void run_on_threads(int jobs, size_t n, const std::function<void(size_t)>& work) {
  std::atomic<size_t> next{0};
  std::mutex failure_mutex;
  std::exception_ptr failure;
  const auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      try {
        work(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failure) failure = std::current_exception();
      }
    }
  };
  std::vector<std::thread> threads;
  for (int w = 1; w < jobs; ++w) threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads) t.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace

LayoutSearch search_layouts(const JobConfig& base, const LayoutSearchOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  // The model (and the data, paths, ...) are the base job's whatever the layout: checked once.
  const CheckedJob checked = check_job(without_layout(base));
  const models::ModelArgs& model = *checked.model.args;
  const bool moe = model.fields().contains("moe");
  LayoutSpace space = options.space;
  space.ep = space.ep && moe;  // a dense model has no experts to split
  LayoutSearch search{.layouts = enumerate_layouts(base, options.world_size, space),
                      .layout_dependence = model.layout_dependence()};
  // The job's own layout rules first (no trace, cheap): what the job itself would reject; and
  // the model states each rank would hold, from shapes.
  struct ToTrace {
    size_t index;  // in search.layouts
    ParallelConfig parallel;
    std::string compute_class;
  };
  std::vector<ToTrace> to_trace;
  for (size_t i = 0; i < search.layouts.size(); ++i) {
    SearchedLayout& candidate = search.layouts[i];
    try {
      ParallelConfig parallel = parallel_config(candidate.job);
      // Every stage needs a block: checked before a schedule of that many ranks is built.
      parallel.stage_ranges(model.n_layers());
      const JobPlan sized =
          plan_job(model, parallel, candidate.job.batch_size, candidate.job.seq_len,
                   PlanOptions{.trace = false, .target = options.target});
      for (const RankModelStates& rank : sized.ranks) {
        candidate.model_state_bytes = std::max(candidate.model_state_bytes, rank.total_bytes());
      }
      if (options.memory_limit_bytes > 0 &&
          candidate.model_state_bytes > options.memory_limit_bytes) {
        candidate.over_limit = true;
        candidate.not_traced =
            fmt::format("its model states alone, {:.1f} MiB per rank, exceed the limit",
                        candidate.model_state_bytes / 1048576.0);
        continue;
      }
      to_trace.push_back({i, std::move(parallel), compute_class(candidate.job, moe)});
    } catch (const Error& e) {
      candidate.pruned = e.what();
    }
  }
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  search.jobs = static_cast<int>(
      std::min<size_t>(options.jobs > 0 ? static_cast<size_t>(options.jobs) : cores,
                       std::max<size_t>(1, to_trace.size())));
  std::atomic<bool> budget_ran_out{false};
  const auto trace = [&](const ToTrace& item) {
    if (options.budget_s > 0 && seconds_since(start) > options.budget_s) {
      budget_ran_out = true;
      return;  // counted as untraced
    }
    trace_candidate(search.layouts[item.index], item.parallel, model, options);
  };
  const bool bound = options.bound && options.machine.has_value();
  if (!bound) {
    run_on_threads(search.jobs, to_trace.size(), [&](size_t n) { trace(to_trace[n]); });
  } else {
    // One layout of each compute class first (the most sharded: the likeliest to fit) ...
    std::map<std::string, size_t> representative;  // class -> index in to_trace
    for (size_t n = 0; n < to_trace.size(); ++n) {
      const JobConfig& job = search.layouts[to_trace[n].index].job;
      auto [it, inserted] = representative.emplace(to_trace[n].compute_class, n);
      if (!inserted && job.dp_shard > search.layouts[to_trace[it->second].index].job.dp_shard) {
        it->second = n;
      }
    }
    std::vector<size_t> first;
    for (const auto& [cls, n] : representative) first.push_back(n);
    run_on_threads(search.jobs, first.size(), [&](size_t k) { trace(to_trace[first[k]]); });
    // ... then the others in order of their bound, while it can beat the best within the limit:
    // in rounds of `jobs` layouts, each round deciding on the best of the rounds before, so what
    // is traced depends on the traces' results only, never on which thread finished first.
    double best_ms = std::numeric_limits<double>::infinity();
    const auto consider = [&](const SearchedLayout& c) {
      if (c.traced && !c.over_limit && c.time) best_ms = std::min(best_ms, c.time->step_ms);
    };
    for (size_t n : first) consider(search.layouts[to_trace[n].index]);
    std::vector<std::pair<double, size_t>> rest;  // (bound, index in to_trace)
    const std::set<size_t> traced_first(first.begin(), first.end());
    for (size_t n = 0; n < to_trace.size(); ++n) {
      if (traced_first.count(n) > 0) continue;
      SearchedLayout& c = search.layouts[to_trace[n].index];
      const SearchedLayout& rep =
          search.layouts[to_trace[representative.at(to_trace[n].compute_class)].index];
      if (rep.traced) {
        c.lower_bound_ms =
            1e3 * step_bubble(pipeline_bubble(to_trace[n].parallel), *options.machine) *
            static_cast<double>(rep.max_rank_flops) / options.machine->rank_flops_per_s;
      }
      rest.emplace_back(c.lower_bound_ms, n);
    }
    std::sort(rest.begin(), rest.end());
    for (size_t begin = 0; begin < rest.size();) {
      std::vector<size_t> round;  // indices in to_trace
      for (; begin < rest.size() && round.size() < static_cast<size_t>(search.jobs); ++begin) {
        SearchedLayout& c = search.layouts[to_trace[rest[begin].second].index];
        if (c.lower_bound_ms > best_ms) {  // a tie is traced: the ranking breaks it by order
          c.not_traced = fmt::format(
              "its compute alone, {:.1f} ms with the bubble, cannot beat the best's {:.1f} ms",
              c.lower_bound_ms, best_ms);
          continue;
        }
        round.push_back(rest[begin].second);
      }
      run_on_threads(search.jobs, round.size(), [&](size_t k) { trace(to_trace[round[k]]); });
      for (size_t n : round) consider(search.layouts[to_trace[n].index]);
    }
  }
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

namespace {

// Why the job's rules rejected layouts: each kind of message once (messages that differ only in
// their numbers are one kind), the most common first, with how many and one layout it was.
std::string rejection_reasons(const LayoutSearch& search) {
  struct Kind {
    int count = 0;
    size_t first = 0;  // the first layout of the kind, in search order
  };
  std::map<std::string, Kind> kinds;
  for (size_t i = 0; i < search.layouts.size(); ++i) {
    const std::string& message = search.layouts[i].pruned;
    if (message.empty()) continue;
    std::string key;
    for (size_t k = 0; k < message.size(); ++k) {
      if (std::isdigit(static_cast<unsigned char>(message[k]))) {
        if (key.empty() || key.back() != '#') key += '#';
      } else {
        key += message[k];
      }
    }
    Kind& kind = kinds[key];
    if (kind.count++ == 0) kind.first = i;
  }
  if (kinds.empty()) return "";
  std::vector<const Kind*> order;
  for (const auto& [key, kind] : kinds) order.push_back(&kind);
  std::stable_sort(order.begin(), order.end(), [](const Kind* a, const Kind* b) {
    return a->count != b->count ? a->count > b->count : a->first < b->first;
  });
  constexpr size_t kShown = 6;
  std::string out = "rejected by the job's rules, by reason:\n";
  for (size_t k = 0; k < std::min(order.size(), kShown); ++k) {
    const SearchedLayout& example = search.layouts[order[k]->first];
    out +=
        fmt::format("  {} layout(s), as {}: {}\n", order[k]->count, example.layout, example.pruned);
  }
  if (order.size() > kShown) {
    out += fmt::format("  ... and {} other reason(s)\n", order.size() - kShown);
  }
  return out;
}

}  // namespace

std::string format_layout_search(const LayoutSearch& search, const LayoutSearchOptions& options) {
  int pruned = 0, traced = 0, reused = 0, over = 0, states_over = 0, bounded = 0;
  double trace_s = 0;
  // Only a cache keeps what was traced for the next run (--no-search-cache keeps nothing).
  const std::string go_on = search.cache_dir.empty() ? "give a larger --search-budget-s"
                                                     : "run again to go on from the cache";
  for (const SearchedLayout& c : search.layouts) {
    pruned += !c.pruned.empty();
    traced += c.traced && !c.from_cache;
    reused += c.from_cache;
    over += c.over_limit;
    states_over += c.over_limit && !c.traced;
    bounded += !c.traced && !c.over_limit && !c.not_traced.empty();
    trace_s += c.trace_s;
  }
  std::string out = fmt::format(
      "loom plan --search: {} layouts of {} ranks: {} rejected by the job's rules, {} over the "
      "memory limit{}{}, {} that could not beat the best (their compute alone, from a traced "
      "layout of the same products), {} traced{}, {} read back from the trace cache; {:.1f} s in "
      "all{}\n",
      search.layouts.size(), options.world_size, pruned, over,
      options.memory_limit_bytes > 0
          ? fmt::format(" of {:.4g} MiB per rank", options.memory_limit_bytes / 1048576.0)
          : std::string(),
      states_over > 0 ? fmt::format(" ({} by their model states alone, not traced)", states_over)
                      : std::string(),
      bounded, traced,
      traced > 0 ? fmt::format(" ({:.0f} ms each on average, {} at once)", 1000 * trace_s / traced,
                               search.jobs)
                 : std::string(),
      reused, search.seconds,
      search.budget_ran_out ? fmt::format(" (the budget ran out: some were not traced; {})", go_on)
                            : "");
  if (!search.cache_dir.empty()) {
    out += fmt::format("traces kept in {}{}\n", search.cache_dir,
                       search.cache_write_error.empty()
                           ? std::string()
                           : fmt::format(" (could not write it: {})", search.cache_write_error));
  }
  out += rejection_reasons(search);
  if (!search.layout_dependence.empty()) {
    out += fmt::format("note: {}\n", search.layout_dependence);
  }
  if (search.ranking.empty()) {
    if (search.budget_ran_out) {
      return out + fmt::format(
                       "no layout ranked: the budget (--search-budget-s {}) ran out before one "
                       "was traced; give a larger budget{}\n",
                       options.budget_s, search.cache_dir.empty() ? "" : ", or run again");
    }
    if (over == 0) {
      return out + fmt::format(
                       "no layout ranked: every layout of {} ranks breaks one of the job's rules "
                       "(above); change the job (--batch-size, --microbatches, the model's sizes) "
                       "or --nproc\n",
                       options.world_size);
    }
    return out + fmt::format(
                     "no layout ranked: {} of them over the memory limit of {:.4g} MiB per rank "
                     "(--search-memory-gib), the rest against the job's rules; give a larger "
                     "limit, more ranks or a smaller job\n",
                     over, options.memory_limit_bytes / 1048576.0);
  }
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
    // Faster than the winner but over the memory limit: what memory cost.
    std::vector<const SearchedLayout*> faster;
    for (const SearchedLayout& c : search.layouts) {
      if (c.traced && c.over_limit && c.time && c.time->step_ms < best.time->step_ms) {
        faster.push_back(&c);
      }
    }
    std::sort(faster.begin(), faster.end(), [](const SearchedLayout* a, const SearchedLayout* b) {
      return a->time->step_ms < b->time->step_ms;
    });
    std::string over;
    for (size_t i = 0; i < std::min<size_t>(faster.size(), 3); ++i) {
      over += fmt::format("  {}: {:.1f} ms, lost on memory ({:.1f} MiB per rank at its peak)\n",
                          faster[i]->layout, faster[i]->time->step_ms,
                          faster[i]->peak_bytes / 1048576.0);
    }
    if (!over.empty()) {
      out += fmt::format("\nFaster, over the memory limit ({} in all):\n{}", faster.size(), over);
    }
  }
  out += fmt::format(
      "\nThe winner's job-file lines:\n\n[parallel]\ntp = {}\npp = {}\ndp_replicate = {}\n"
      "dp_shard = {}\n",
      best.job.tp, best.job.pp, best.job.dp_replicate, best.job.dp_shard);
  // Every key the search sets, defaults included: the job's own flags or file may set them
  // otherwise (--ep 2, --microbatches 4, --layers-per-stage 1,3, --dp 2, the shorthand that
  // dp_replicate would contradict), and would then run another layout or be refused.
  out += fmt::format(
      "cp = {}\nep = {}\nschedule = \"{}\"\nmicrobatches = {}\nvirtual_stages = {}\n"
      "layers_per_stage = \"{}\"\ncp_attention = \"{}\"\ndp = 0\n",
      best.job.cp, best.job.ep, best.job.schedule, best.job.microbatches, best.job.virtual_stages,
      best.job.layers_per_stage, best.job.cp_attention);
  out +=
      fmt::format("\n[training]\nactivation_checkpoint = \"{}\"\n", best.job.activation_checkpoint);
  return out;
}

}  // namespace loom::train
