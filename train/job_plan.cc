#include "train/job_plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>

#include "base/error.h"
#include "dtensor/shard_math.h"
#include "parallel/fsdp/flat_layout.h"
#include "parallel/pipeline/schedules.h"
#include "parallel/pipeline/split.h"

namespace loom::train {

namespace {

// The parameter's shape on tp coordinate `tp_index` (the plan's shard, even or not).
Shape tp_local_shape(const models::PlannedParameter& p, int64_t tp, int64_t tp_index) {
  Shape local = p.shape;
  if (p.tp_shard_dim && tp > 1) {
    const auto d = static_cast<size_t>(*p.tp_shard_dim);
    local[d] = shard_range(local[d], tp, tp_index).size;
  }
  return local;
}

// Elements a rank holds of one FSDP unit's parameters (or all of them without FSDP): its
// dp_shard chunk of each, as fully_shard cuts dim 0 (parallel/fsdp/flat_layout.h).
int64_t held_elements(const std::vector<Shape>& shapes, int64_t dp_shard, int64_t shard_index) {
  if (dp_shard == 1) {
    int64_t n = 0;
    for (const Shape& s : shapes) n += shape_numel(s);
    return n;
  }
  const fsdp::FlatLayout layout = fsdp::FlatLayout::make(shapes, static_cast<int>(dp_shard));
  int64_t n = 0;
  for (const fsdp::ParamSlot& slot : layout.params) {
    n += slot.rows_of(static_cast<int>(shard_index)) * slot.row_numel;
  }
  return n;
}

std::string mib(int64_t bytes) {
  return fmt::format("{:.1f}", static_cast<double>(bytes) / (1 << 20));
}

std::string ranks_str(const std::vector<int>& ranks) {
  // Runs of consecutive ranks as "a-b".
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += j == i ? fmt::format("{}", ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]);
    i = j + 1;
  }
  return out;
}

// The job's layout checks, and its sequence against the model's context.
void validate_layout(const ParallelConfig& parallel, int64_t global_batch, int64_t seq_len,
                     int64_t context) {
  parallel.validate(parallel.dims.world_size(), global_batch, seq_len);
  LOOM_CHECK(seq_len <= context,
             "--seq-len: {} tokens per sequence is more than the model's context of {}", seq_len,
             context);
}

// A vocabulary tp does not divide is split unevenly: said, with both shard sizes.
void add_uneven_vocabulary_note(JobPlan& plan, int64_t vocab, const char* rows) {
  const int64_t tp = plan.parallel.dims.tp;
  if (tp == 1 || vocab % tp == 0) return;
  plan.notes.push_back(fmt::format(
      "the vocabulary ({} tokens) does not divide by tp={}: {} split unevenly, {} on the first tp "
      "ranks and {} on the last",
      vocab, tp, rows, shard_range(vocab, tp, 0).size, shard_range(vocab, tp, tp - 1).size));
}

// A mixture of experts' routing is the router's, known only when it runs: the trace (values on
// the meta device) routes uniformly, which the figures it gives rest on. Said.
void add_routing_note(JobPlan& plan, int64_t experts, int64_t ep) {
  if (experts == 0) return;
  plan.notes.push_back(fmt::format(
      "mixture of experts: the traced step routes every token's choices uniformly over the {} "
      "experts (token t's c-th choice is expert (t k + c) mod {}); a real step routes as its "
      "routers choose: the busiest experts' FLOPs{} and the peaks of the ranks holding them "
      "grow with the imbalance the metrics line reports as expert load max/mean, the others' "
      "shrink (with a capacity factor, the tokens over an expert's capacity are dropped, not "
      "computed{}: the metrics' moe_dropped counts them)",
      experts, experts, ep > 1 ? ", the all-to-all bytes to their ranks" : "",
      ep > 1 ? " or sent" : ""));
}

// The "| ranks | group | kind | calls | MiB |" rows of one set of ranks' operations.
std::string collective_rows(const std::string& ranks,
                            const std::map<std::string, comm::CollectiveCounters>& collectives) {
  std::string out;
  for (const auto& [group, counters] : collectives) {
    for (size_t k = 0; k < counters.calls.size(); ++k) {
      if (counters.calls[k] == 0) continue;
      out += fmt::format("| {} | {} | {} | {} | {} |\n", ranks, group,
                         comm::collective_name(static_cast<comm::CollectiveKind>(k)),
                         counters.calls[k], mib(counters.bytes[k]));
    }
  }
  return out.empty() ? fmt::format("| {} | - | none | 0 | 0 |\n", ranks) : out;
}

// --val-data: a validation batch's traced peak and FLOPs per role, and what the validations cost
// over the run (their time predicted as the step's compute scaled by the FLOPs: forward only,
// no gradient communication).
std::string format_validation(const JobPlan& plan) {
  const PlanOptions::Validation& v = plan.validation;
  const int64_t runs =
      (v.every > 0 ? v.steps / v.every : 0) + (v.every > 0 && v.steps % v.every == 0 ? 0 : 1);
  std::string out = fmt::format(
      "\nValidation (--val-data: {} batches of {} x {} tokens, {} times in {} steps; traced, "
      "forward only; MiB, GFLOP):\n\n| ranks | peak in a batch | peak - held | GFLOP per batch "
      "|\n|---|---:|---:|---:|\n",
      v.batches, plan.global_batch, plan.seq_len, runs, v.steps);
  int64_t step_flops = 0, validation_flops = 0;
  for (const TracedRole& role : plan.traced_roles) {
    const TracedRank* t = nullptr;
    for (const TracedRank& r : plan.traced) {
      if (r.rank == role.ranks.front()) t = &r;
    }
    if (t == nullptr) continue;
    out += fmt::format("| {} | {} | {} | {:.1f} |\n", ranks_str(role.ranks),
                       mib(t->validation_peak_bytes), mib(t->validation_peak_bytes - t->held_bytes),
                       static_cast<double>(t->validation_flops) / 1e9);
    step_flops = std::max(step_flops, t->flops);
    validation_flops = std::max(validation_flops, t->validation_flops);
  }
  if (plan.time && step_flops > 0) {
    const double batch_ms = plan.time->compute_ms * static_cast<double>(validation_flops) /
                            static_cast<double>(step_flops);
    const double run_ms = batch_ms * static_cast<double>(v.batches);
    const double per_step = run_ms * static_cast<double>(runs) / static_cast<double>(v.steps);
    out += fmt::format(
        "\n  about {:.1f} ms per validation ({:.1f} ms a batch, the step's compute scaled by "
        "FLOPs), {:.1f} ms per training step averaged over the run ({:.1f} % of the step)\n",
        run_ms, batch_ms, per_step, 100 * per_step / plan.time->step_ms);
  }
  // Its communication: forward only (FSDP's all-gathers, a pipeline's activations, the loss's
  // average), the same for each of its batches.
  out +=
      "\nCommunication per validation batch and rank (calls, MiB sent by the rank):\n\n"
      "| ranks | group | kind | calls | MiB |\n|---|---|---|---:|---:|\n";
  for (const TracedRole& role : plan.traced_roles) {
    for (const TracedRank& r : plan.traced) {
      if (r.rank == role.ranks.front()) {
        out += collective_rows(ranks_str(role.ranks), r.validation_collectives);
      }
    }
  }
  return out;
}

// Traces the job's step (train/step_trace.h) and groups the traced ranks with equal figures.
void trace_job(JobPlan& plan, const PlanOptions& options, const ModelBuilder& build) {
  const ParallelDims& dims = plan.parallel.dims;
  plan.target = options.target;
  const PlanOptions::Replicas& replicas = options.replicas;
  plan.traced = trace_training_step(
      dims, build,
      {.local_batch = plan.global_batch / dims.dp() / replicas.count,  // a replica's share
       .seq_len = plan.seq_len / dims.cp,                              // this rank's tokens
       .ranks = ranks_to_trace(dims, options.max_traced_ranks),
       .target = options.target,
       .validation = options.validation.batches > 0,
       .replicas = replicas.count,
       .replica = replicas.replica,
       .replay = replicas.replay});
  plan.validation = options.validation;
  std::vector<size_t> representative;  // index in plan.traced of each role's first rank
  for (size_t i = 0; i < plan.traced.size(); ++i) {
    const TracedRank& t = plan.traced[i];
    const auto same = [&](size_t j) {
      const TracedRank& u = plan.traced[j];
      return u.parameters == t.parameters && u.held_bytes == t.held_bytes &&
             u.peak_bytes == t.peak_bytes && u.flops == t.flops &&
             u.construction_peak_bytes == t.construction_peak_bytes && same_collectives(u, t);
    };
    size_t role = 0;
    while (role < representative.size() && !same(representative[role])) ++role;
    if (role == representative.size()) {
      representative.push_back(i);
      plan.traced_roles.push_back({});
    }
    plan.traced_roles[role].ranks.push_back(t.rank);
  }
  if (options.machine) {
    plan.machine = options.machine;
    plan.time =
        estimate_step_time(plan.traced, plan.parallel, plan.global_batch * plan.seq_len,
                           plan.world_size, *options.machine, replicas.replay ? 1 : replicas.count);
  }
}

}  // namespace

JobPlan plan_job(const models::ModelArgs& model, const ParallelConfig& parallel,
                 int64_t global_batch, int64_t seq_len, const PlanOptions& options) {
  const ParallelDims& dims = parallel.dims;
  // The job's own checks, in the job's order and words.
  model.validate();
  validate_layout(parallel, global_batch, seq_len, model.context());
  if (dims.tp > 1) model.validate_tp(dims.tp);
  check_context_parallel(model, dims.cp);
  check_expert_parallel(model, dims.ep);

  JobPlan plan{.model_summary = model.summary(),
               .world_size = dims.world_size(),
               .parallel = parallel,
               .global_batch = global_batch,
               .seq_len = seq_len};
  // Stages: the schedule the job would run (validated there), and its split of the blocks.
  const std::vector<pipeline::StageRange> ranges = parallel.stage_ranges(model.n_layers());
  plan.num_stages = static_cast<int>(ranges.size());
  std::optional<pipeline::Schedule> schedule;
  if (dims.pp > 1) {
    schedule =
        pipeline::schedule_by_name(parallel.pipeline.schedule, static_cast<int>(dims.pp),
                                   parallel.microbatches(), parallel.pipeline.virtual_stages);
  }
  if (schedule) {
    PipelinePlan pipeline{
        .schedule = schedule->name,
        .placement = pipeline::placement_rule(schedule->placement, schedule->num_ranks),
        .num_stages = schedule->num_stages,
        .microbatches = schedule->num_microbatches,
        .idle_share = pipeline::simulated_idle_share(*schedule, 1.0, 2.0, 1.0)};
    for (int rank = 0; rank < schedule->num_ranks; ++rank) {
      pipeline.stages.push_back(schedule->stages_of_rank(rank));
      pipeline.peak_microbatches.push_back(pipeline::peak_microbatches_in_flight(*schedule, rank));
    }
    plan.pipeline = std::move(pipeline);
  }
  add_uneven_vocabulary_note(plan, model.vocab_size(), "the vocabulary-sharded rows");
  add_routing_note(plan, model.num_experts(), dims.ep);
  if (const std::string note = model.layout_dependence(); !note.empty()) {
    plan.notes.push_back(note);
  }

  // Each stage's parameters, listed once for every rank that runs it (none: the family does not
  // list them, and the trace sizes the model states).
  std::vector<std::vector<models::PlannedParameter>> stage_parameters;
  for (const pipeline::StageRange& range : ranges) {
    stage_parameters.push_back(model.planned_parameters(range));
  }
  if (!stage_parameters.front().empty()) {
    // Every rank of the mesh, row-major: its coordinate on each dim.
    const std::vector<std::string> names = dims.names();
    const std::vector<int64_t> sizes = dims.sizes();
    const auto at = [&](const std::vector<int64_t>& coordinate, const char* dim) {
      return coordinate[std::find(names.begin(), names.end(), dim) - names.begin()];
    };
    std::map<std::tuple<std::vector<int>, int64_t>, size_t> role_of;
    // The stages and parameter elements of a rank at pp, tp and shard coordinates `pp`, `tp`,
    // `shard` (FSDP shards over dp_shard x cp: dp_shard_cp with context parallelism).
    const auto states_at = [&](int64_t pp, int64_t tp, int64_t shard) {
      std::pair<std::vector<int>, int64_t> out{
          schedule ? schedule->stages_of_rank(static_cast<int>(pp)) : std::vector<int>{0}, 0};
      for (int s : out.first) {
        // FSDP's units: each block, then the stage's remaining parameters ("root").
        // Expert parallelism: experts / ep of each MoE's, a unit of their own sharded over the
        // ep_shard ranks holding the same experts (ep innermost in dp_shard x cp).
        std::map<int64_t, std::vector<Shape>> units, expert_units;
        for (const auto& p : stage_parameters[s]) {
          if (p.expert && dims.ep > 1) {
            Shape local = p.shape;
            local[0] /= dims.ep;
            expert_units[p.block].push_back(local);
            continue;
          }
          units[p.block].push_back(tp_local_shape(p, dims.tp, tp));
        }
        for (const auto& [block, shapes] : units) {
          out.second += held_elements(shapes, dims.dp_shard * dims.cp, shard);
        }
        const int64_t ep_shard = dims.dp_shard * dims.cp / dims.ep;
        for (const auto& [block, shapes] : expert_units) {
          out.second += held_elements(shapes, ep_shard, shard / dims.ep);
        }
      }
      return out;
    };
    // Each (pp, tp, shard) sized once: a 1024-rank layout has far fewer, and `loom plan --search`
    // sizes thousands of layouts.
    std::map<std::tuple<int64_t, int64_t, int64_t>, std::pair<std::vector<int>, int64_t>> sized;
    for (int rank = 0; rank < plan.world_size; ++rank) {
      std::vector<int64_t> coordinate(sizes.size());
      for (int64_t d = static_cast<int64_t>(sizes.size()) - 1, rest = rank; d >= 0; --d) {
        coordinate[d] = rest % sizes[d];
        rest /= sizes[d];
      }
      RankModelStates states{.rank = rank, .coordinate = coordinate};
      const int64_t pp = at(coordinate, kPipelineDim), tp = at(coordinate, kTensorDim),
                    shard = at(coordinate, kShardDim) * dims.cp + at(coordinate, kContextDim);
      auto [known, fresh] = sized.try_emplace({pp, tp, shard});
      if (fresh) known->second = states_at(pp, tp, shard);
      std::tie(states.stages, states.parameters) = known->second;
      const auto key = std::make_tuple(states.stages, states.parameters);
      if (auto it = role_of.find(key); it != role_of.end()) {
        plan.roles[it->second].ranks.push_back(rank);
      } else {
        role_of.emplace(key, plan.roles.size());
        plan.roles.push_back({{rank}});
      }
      plan.ranks.push_back(std::move(states));
    }
  }
  if (options.trace) {
    std::shared_ptr<const models::ModelArgs> args = model.clone();
    trace_job(plan, options, [args, parallel](std::shared_ptr<const DeviceMesh> mesh) {
      return build_parallel_model(*args, /*seed=*/0, std::move(mesh), parallel);
    });
  }
  return plan;
}

namespace {

// The schedule's idle share and, per pp rank, its stages, the most microbatches it holds, and the
// traced activation peak (peak - held) of a traced rank at that pp coordinate.
std::string format_pipeline(const JobPlan& plan) {
  const PipelinePlan& p = *plan.pipeline;
  std::string out = fmt::format(
      "\nPipeline schedule {} ({}; {} stages, {} microbatches): idle {:.1f} % of the step on its "
      "own timeline (F : B : W = 1 : 2 : 1, messages free); per pp rank the most "
      "stage-microbatches whose activations it holds, and the traced step's peak - held:\n\n"
      "| pp rank | stages | peak microbatches held | traced peak - held MiB |\n"
      "|---|---|---:|---:|\n",
      p.schedule, p.placement, p.num_stages, p.microbatches, 100 * p.idle_share);
  const std::vector<std::string> names = plan.parallel.dims.names();
  const size_t pp_dim = std::find(names.begin(), names.end(), kPipelineDim) - names.begin();
  for (size_t rank = 0; rank < p.stages.size(); ++rank) {
    std::string traced = "-";
    for (const TracedRank& t : plan.traced) {
      if (pp_dim < t.coordinate.size() && t.coordinate[pp_dim] == static_cast<int64_t>(rank)) {
        traced = mib(t.peak_bytes - t.held_bytes);
        break;
      }
    }
    out += fmt::format("| {} | {} | {} | {} |\n", rank, fmt::join(p.stages[rank], ","),
                       p.peak_microbatches[rank], traced);
  }
  return out;
}

}  // namespace

std::string format_job_plan(const JobPlan& plan) {
  const ParallelDims& dims = plan.parallel.dims;
  std::string out = fmt::format(
      "loom plan: {}\n  layout {} ({} ranks), {} pipeline stage{}, global batch {} x {} tokens{}\n"
      "  checks passed: degrees x world, batch x dp x grad_accum and microbatches, schedule, "
      "model sizes, heads over tp, layers per stage{}\n",
      plan.model_summary, dims.str(), plan.world_size, plan.num_stages,
      plan.num_stages == 1 ? "" : "s", plan.global_batch, plan.seq_len,
      plan.parallel.mixed_precision ? ", bf16 compute over f32 weights" : "",
      plan.traced.empty() ? ""
                          : fmt::format(", a traced step of the job's own code (allocating as "
                                        "the {} kernels do)",
                                        plan.target.is_cpu() ? "CPU" : "GPU"));
  for (const std::string& note : plan.notes) out += fmt::format("  note: {}\n", note);
  if (!plan.roles.empty()) {
    out +=
        "\nModel states per rank, from shapes (f32 parameters, their gradients, AdamW's two "
        "moments; MiB):\n\n"
        "| ranks | stages | parameters | parameters MiB | gradients MiB | optimizer MiB | total "
        "MiB |\n|---|---|---:|---:|---:|---:|---:|\n";
    for (const RankRole& role : plan.roles) {
      const RankModelStates& r = plan.rank(role.ranks.front());
      out += fmt::format("| {} | {} | {} | {} | {} | {} | {} |\n", ranks_str(role.ranks),
                         fmt::join(r.stages, ","), r.parameters, mib(r.parameter_bytes()),
                         mib(r.gradient_bytes()), mib(r.optimizer_bytes()), mib(r.total_bytes()));
    }
  }
  if (plan.pipeline) out += format_pipeline(plan);
  if (plan.traced.empty()) return out;
  const auto traced_rank = [&](int rank) -> const TracedRank& {
    for (const TracedRank& t : plan.traced) {
      if (t.rank == rank) return t;
    }
    throw Error(fmt::format("format_job_plan: rank {} was not traced", rank));
  };
  out += fmt::format(
      "\nTraced step per rank (the job's code on the meta device, its second step; MiB, GFLOP){}:"
      "\n\n| ranks | parameters | held between steps | peak in step | peak - held | GFLOP | "
      "peak building the model |\n|---|---:|---:|---:|---:|---:|---:|\n",
      static_cast<int64_t>(plan.traced.size()) < plan.world_size
          ? fmt::format(" — {} of {} ranks traced, the others' pipeline lines are like these",
                        plan.traced.size(), plan.world_size)
          : "");
  for (const TracedRole& role : plan.traced_roles) {
    const TracedRank& t = traced_rank(role.ranks.front());
    out += fmt::format("| {} | {} | {} | {} | {} | {:.1f} | {} |\n", ranks_str(role.ranks),
                       t.parameters, mib(t.held_bytes), mib(t.peak_bytes),
                       mib(t.peak_bytes - t.held_bytes), static_cast<double>(t.flops) / 1e9,
                       mib(t.construction_peak_bytes));
  }
  out +=
      "\nCommunication per step and rank (calls, MiB sent by the rank; p2p counts sends and "
      "receives):\n\n| ranks | group | kind | calls | MiB |\n|---|---|---|---:|---:|\n";
  // Roles that differ in memory but not in communication share their rows.
  std::vector<std::vector<int>> same_operations;  // traced ranks
  std::vector<const TracedRank*> operations_of;
  for (const TracedRole& role : plan.traced_roles) {
    const TracedRank& t = traced_rank(role.ranks.front());
    size_t i = 0;
    while (i < operations_of.size() && !same_collectives(*operations_of[i], t)) ++i;
    if (i == operations_of.size()) {
      operations_of.push_back(&t);
      same_operations.emplace_back();
    }
    auto& ranks = same_operations[i];
    ranks.insert(ranks.end(), role.ranks.begin(), role.ranks.end());
  }
  for (size_t i = 0; i < operations_of.size(); ++i) {
    std::sort(same_operations[i].begin(), same_operations[i].end());
    out += collective_rows(ranks_str(same_operations[i]), operations_of[i]->collectives);
  }
  if (plan.validation.batches > 0) out += format_validation(plan);
  if (plan.time) {
    const StepTimeEstimate& t = *plan.time;
    out += fmt::format(
        "\nStep time (train/step_time_model.h; {}: {:.1f} GFLOP/s per rank, latency {:.1f} us, "
        "{:.2f} GB/s):\n  compute {:.1f} ms + exposed communication {:.1f} ms{} = {:.1f} ms per "
        "step, {:.0f} tokens/s",
        plan.machine->source, plan.machine->rank_flops_per_s / 1e9, plan.machine->latency_s * 1e6,
        plan.machine->bytes_per_s / 1e9, t.compute_ms, t.exposed_comm_ms,
        t.bubble > 1 ? fmt::format(", x {:.3f} pipeline bubble", t.bubble) : std::string(),
        t.step_ms, t.tokens_per_s);
    if (t.mfu > 0) out += fmt::format(", MFU {:.1f} %", 100 * t.mfu);
    out += "\n";
  }
  return out;
}

}  // namespace loom::train
