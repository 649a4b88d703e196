#include "train/plan_command.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <sstream>

#include "base/durable_file.h"
#include "base/error.h"
#include "checkpoint/distributed_checkpoint.h"
#include "comm/launch_env.h"
#include "parallel/ft/traced_replicas.h"
#include "tensor/cuda/cuda_runtime.h"
#include "train/job_checks.h"
#include "train/job_plan.h"
#include "train/layout_search.h"

namespace loom::train {

namespace {

// --plan-dim-link-gbps dim=GBPS[,dim=GBPS...], as bytes per second by dim; checked whether or not
// a machine is modelled, so that a typo is named even when the figures go unused.
std::map<std::string, double> dim_link_bytes_per_s(const JobConfig& job) {
  std::map<std::string, double> out;
  std::stringstream items(job.plan_dim_link_gbps);
  const std::vector<std::string> names = ParallelDims{}.names();
  for (std::string item; std::getline(items, item, ',');) {
    const auto eq = item.find('=');
    const std::string dim = item.substr(0, eq);
    double gbps = 0;
    try {
      gbps = eq == std::string::npos ? 0 : std::stod(item.substr(eq + 1));
    } catch (const std::exception&) {
      gbps = 0;  // reported below
    }
    LOOM_CHECK(eq != std::string::npos && gbps > 0 &&
                   std::find(names.begin(), names.end(), dim) != names.end(),
               "--plan-dim-link-gbps: expected DIM=GBPS items separated by commas, DIM one of "
               "{}, GBPS a positive number; got '{}'",
               fmt::join(names, ", "), item);
    out[dim] = gbps * 1e9;
  }
  return out;
}

}  // namespace

std::optional<MachineModel> plan_machine(const JobConfig& job, int64_t ranks, bool gpu_job,
                                         std::string* missing) {
  const std::map<std::string, double> dim_links = dim_link_bytes_per_s(job);
  std::optional<MachineModel> machine;
  if (job.plan_rank_tflops > 0) {
    LOOM_CHECK(job.plan_link_gbps > 0,
               "--plan-rank-tflops {} needs --plan-link-gbps (the links' GB/s) as well",
               job.plan_rank_tflops);
    machine =
        MachineModel{.rank_flops_per_s = job.plan_rank_tflops * 1e12,
                     .seconds_per_written_byte = 0,
                     .seconds_per_op = 0,
                     .latency_s = (job.plan_latency_us > 0 ? job.plan_latency_us : 10.0) * 1e-6,
                     .bytes_per_s = job.plan_link_gbps * 1e9,
                     .source = "given by --plan-rank-tflops, --plan-link-gbps"};
    // An op's output byte costs two read and one written (as calibrate_machine measures).
    if (job.plan_memory_gbps > 0) {
      machine->seconds_per_written_byte = 3.0 / (job.plan_memory_gbps * 1e9);
    }
  } else if (gpu_job) {
    *missing =
        "no step time: this machine's calibration is for CPU ranks; give the GPUs' figures "
        "(--plan-rank-tflops, --plan-link-gbps, and --plan-memory-gbps, --plan-peak-tflops)";
    return std::nullopt;
  } else if (const auto calibration = load_calibration()) {
    machine = MachineModel::for_cpu_ranks(*calibration, ranks);
  } else {
    *missing = fmt::format(
        "no step time: run `./loom plan --calibrate` once to measure this machine (stored in "
        "{}), or give --plan-rank-tflops and --plan-link-gbps for another",
        calibration_path());
    return std::nullopt;
  }
  if (job.plan_peak_tflops > 0) machine->peak_flops_per_s = job.plan_peak_tflops * 1e12;
  machine->dim_bytes_per_s = dim_links;
  LOOM_CHECK(
      machine->peak_flops_per_s == 0 || machine->peak_flops_per_s >= machine->rank_flops_per_s,
      "--plan-peak-tflops {}: below the rank's rate, {:.4g} TFLOP/s (--plan-rank-tflops "
      "or the calibration); the peak is the chip's most, what MFU divides by",
      job.plan_peak_tflops, machine->rank_flops_per_s / 1e12);
  return machine;
}

PlanReport plan_report(const JobConfig& job) {
  if (job.search) return search_report(job);
  const CheckedJob checked = check_job(job);
  PlanOptions options;
  // A CPU job is traced allocating as the CPU's kernels do; --device cuda (or auto with a GPU
  // here) as a GPU's.
  options.target = job.device == "cpu" || (job.device == "auto" && !cuda::available())
                       ? Device::cpu()
                       : Device::cuda();
  std::string missing;
  options.machine =
      plan_machine(job, checked.parallel.dims.world_size(), options.target.is_cuda(), &missing);
  if (checked.data.val) {
    options.validation = {
        .batches = checked.data.val_batches, .every = job.val_every, .steps = job.steps};
  }
  options.replicas = {.count = static_cast<int>(job.replicas),
                      .replica = static_cast<int>(job.replica),
                      .replay = !job.replica_replay.empty()};
  JobPlan plan =
      plan_job(*checked.model.args, checked.parallel, job.batch_size, job.seq_len, options);
  if (job.steps == 1) {
    plan.notes.push_back(
        "--steps 1: the table's step is a job's second, every later one's; a job's first step "
        "creates AdamW's moments at its end, so its peak (what a job of one step prints) is "
        "lower by what they and the gradients held from the step before add");
  }
  if (job.replicas > 1) {
    const int64_t share = job.batch_size / job.replicas;
    plan.notes.push_back(
        job.replica_replay.empty()
            ? fmt::format(
                  "--replicas {}: this job is replica {}, training its share of the global "
                  "batch, {} of {} sequences per step (the step traced), and every step "
                  "averaging each rank's gradients over the replicas taking part: one all_reduce "
                  "on '{}' (a group of {} ranks across the jobs; named 'ft/<rank>/step<N>' in a "
                  "run) and the quorum's agreements over this job's ranks, as traced with every "
                  "replica taking part",
                  job.replicas, job.replica, share, job.batch_size,
                  parallel::ft::kTracedReplicasGroup, job.replicas)
            : fmt::format(
                  "--replica-replay: each step runs the share of every replica that took part "
                  "in it, one after another, {} of {} sequences each: traced with all {} taking "
                  "part (a step with fewer members runs fewer)",
                  share, job.batch_size, job.replicas));
  }
  if (!job.checkpoint_dir.empty()) {
    // Not in the step's table: a save is between steps, every --checkpoint-every.
    // Every --checkpoint-every steps, and after the last when that is not one of them.
    const int64_t every = job.checkpoint_every;
    const int64_t saves = every > 0 ? job.steps / every + (job.steps % every != 0) : 1;
    plan.notes.push_back(fmt::format(
        "--checkpoint-dir: each save ({} in this run: {}) adds {} all_gathers over the world's {} "
        "ranks, of metadata only (each rank's pieces, checksums, success; a few KiB), not of "
        "tensors: {} while training waits, then {} to commit{}",
        saves,
        job.checkpoint_every > 0
            ? fmt::format("every {} steps and after the last", job.checkpoint_every)
            : std::string("after the last step"),
        checkpoint::kStageSaveAllGathers + checkpoint::kCommitSaveAllGathers,
        checked.parallel.dims.world_size(), checkpoint::kStageSaveAllGathers,
        checkpoint::kCommitSaveAllGathers,
        job.async_checkpoint ? " (in the background, on the saver's own group)" : ""));
  }
  if (job.async_checkpoint && !job.checkpoint_dir.empty() && !plan.ranks.empty()) {
    // What an asynchronous save copies (parameters and optimizer state; a piece replicated over
    // dp_replicate is written, so copied, by one of its replicas: each copies about its share),
    // and the most a rank then holds: at the save (between steps), during a step the write
    // runs into.
    const int64_t replicas = std::max<int64_t>(1, checked.parallel.dims.dp_replicate);
    const auto copy_of = [&](const RankModelStates& rank) {
      return (rank.parameter_bytes() + rank.optimizer_bytes()) / replicas;
    };
    int64_t staged = 0, at_save = 0, in_step = 0;
    for (const RankModelStates& rank : plan.ranks) staged = std::max(staged, copy_of(rank));
    for (const TracedRank& rank : plan.traced) {
      const int64_t copy = copy_of(plan.rank(rank.rank));
      at_save = std::max(at_save, rank.held_bytes + copy);
      in_step = std::max(in_step, rank.peak_bytes + copy);
    }
    std::string peaks;
    if (in_step > 0) {
      peaks = fmt::format(
          " (at most {:.1f} MiB per rank at the save, {:.1f} MiB if the write runs "
          "into the next step)",
          at_save / 1048576.0, in_step / 1048576.0);
    }
    plan.notes.push_back(fmt::format(
        "--async-checkpoint: each save first copies a rank's share of the parameters and "
        "optimizer state, about {:.1f} MiB, and holds the copy until it is written in the "
        "background{}; a "
        "synchronous save writes from the tensors themselves",
        staged / 1048576.0, peaks));
  }
  std::string out;
  for (const std::string& warning : checked.warnings) out += fmt::format("{}\n", warning);
  out += format_job_plan(plan);
  if (!missing.empty()) out += fmt::format("\n{}\n", missing);
  return {.text = out};
}

PlanReport search_report(const JobConfig& job) {
  LayoutSearchOptions options{
      .world_size = search_world_size(job),
      .top = static_cast<int>(job.search_top),
      .budget_s = job.search_budget_s,
      .memory_limit_bytes = static_cast<int64_t>(job.search_memory_gib * 1024 * 1024 * 1024),
      .target = job.device == "cpu" || (job.device == "auto" && !cuda::available())
                    ? Device::cpu()
                    : Device::cuda()};
  options.jobs = static_cast<int>(job.search_jobs);
  options.space = {.cp = job.search_cp, .ep = job.search_ep};
  options.bound = job.search_bound;
  TraceCache cache = job.search_cache ? TraceCache::for_this_binary() : TraceCache();
  if (job.search_cache) options.cache = &cache;
  std::string missing;
  options.machine = plan_machine(job, options.world_size, options.target.is_cuda(), &missing);
  const LayoutSearch search = search_layouts(job, options);
  std::string out = format_layout_search(search, options);
  if (!job.layers_per_stage.empty()) {
    out = fmt::format(
        "note: --layers-per-stage {} is one pipeline's split: the search splits each layout's "
        "pipeline evenly\n{}",
        job.layers_per_stage, out);
  }
  if (!missing.empty() && !search.ranking.empty()) {
    out += fmt::format("\n{} (ranked by peak memory instead)\n", missing);
  }
  return {.text = out, .exit_code = search.ranking.empty() ? comm::kExitBadInput : 0};
}

std::string calibrate_and_store() {
  const nlohmann::json figures = calibrate_machine();
  const std::string path = calibration_path();
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  write_file_atomically(path, figures.dump(2) + "\n", "the calibration");
  return fmt::format("{}\nwritten to {}", figures.dump(2), path);
}

}  // namespace loom::train
