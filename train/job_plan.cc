#include "train/job_plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <optional>
#include <tuple>

#include "base/error.h"
#include "dtensor/shard_math.h"
#include "models/gpt/parameter_layout.h"
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

}  // namespace

JobPlan plan_gpt_job(const models::GPTConfig& model, const ParallelConfig& parallel,
                     int64_t global_batch, int64_t seq_len) {
  const ParallelDims& dims = parallel.dims;
  // The job's own checks, in the job's order and words.
  model.validate();
  parallel.validate(dims.world_size(), global_batch, seq_len);
  LOOM_CHECK(seq_len <= model.block_size,
             "--seq-len: {} tokens per sequence is more than the model's context of {}", seq_len,
             model.block_size);
  LOOM_CHECK(model.n_head % dims.tp == 0,
             "parallelize_gpt: n_head={} is not divisible by the tp mesh size {}", model.n_head,
             dims.tp);

  JobPlan plan{
      .model = model, .parallel = parallel, .global_batch = global_batch, .seq_len = seq_len};
  // Stages: the schedule the job would run (validated there), and its even split of the blocks.
  std::vector<models::StageRange> ranges{models::StageRange{0, model.n_layer, true, true}};
  std::optional<pipeline::Schedule> schedule;
  if (dims.pp > 1) {
    schedule =
        pipeline::schedule_by_name(parallel.pipeline.schedule, static_cast<int>(dims.pp),
                                   parallel.microbatches(), parallel.pipeline.virtual_stages);
    plan.num_stages = schedule->num_stages;
    const auto layers = pipeline::split_layers(model.n_layer, plan.num_stages);
    ranges.clear();
    for (int s = 0; s < plan.num_stages; ++s) {
      ranges.push_back({layers[s].begin, layers[s].end, s == 0, s == plan.num_stages - 1});
    }
  }
  if (dims.tp > 1 && model.vocab_size % dims.tp != 0) {
    plan.notes.push_back(fmt::format(
        "the vocabulary ({} tokens) does not divide by tp={}: wte's rows split unevenly, {} on "
        "the first tp ranks and {} on the last",
        model.vocab_size, dims.tp, shard_range(model.vocab_size, dims.tp, 0).size,
        shard_range(model.vocab_size, dims.tp, dims.tp - 1).size));
  }

  // Each stage's parameters, listed once for every rank that runs it.
  std::vector<std::vector<models::PlannedParameter>> stage_parameters;
  for (const models::StageRange& range : ranges) {
    stage_parameters.push_back(models::gpt_planned_parameters(model, range));
  }

  // Every rank of the (pp, dp_replicate, dp_shard, tp) mesh, row-major.
  std::map<std::tuple<std::vector<int>, int64_t>, size_t> role_of;
  int rank = 0;
  for (int64_t pp = 0; pp < dims.pp; ++pp) {
    for (int64_t rep = 0; rep < dims.dp_replicate; ++rep) {
      for (int64_t shard = 0; shard < dims.dp_shard; ++shard) {
        for (int64_t tp = 0; tp < dims.tp; ++tp, ++rank) {
          RankModelStates states{.rank = rank, .coordinate = {pp, rep, shard, tp}};
          states.stages =
              schedule ? schedule->stages_of_rank(static_cast<int>(pp)) : std::vector<int>{0};
          for (int s : states.stages) {
            // FSDP's units: each block, then the stage's remaining parameters ("root").
            std::map<int64_t, std::vector<Shape>> units;
            for (const auto& p : stage_parameters[s]) {
              units[p.block].push_back(tp_local_shape(p, dims.tp, tp));
            }
            for (const auto& [block, shapes] : units) {
              states.parameters += held_elements(shapes, dims.dp_shard, shard);
            }
          }
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
    }
  }
  return plan;
}

std::string format_job_plan(const JobPlan& plan) {
  const models::GPTConfig& m = plan.model;
  std::string out = fmt::format(
      "loom plan: GPT n_layer={} n_head={} n_embd={} block_size={} vocab_size={} ({} "
      "parameters)\n  layout {} ({} ranks), {} pipeline stage{}, global batch {} x {} tokens\n"
      "  checks passed: degrees x world, batch x dp x grad_accum and microbatches, schedule, "
      "model sizes, heads over tp, layers per stage\n",
      m.n_layer, m.n_head, m.n_embd, m.block_size, m.vocab_size, m.parameter_count(),
      plan.parallel.dims.str(), plan.parallel.dims.world_size(), plan.num_stages,
      plan.num_stages == 1 ? "" : "s", plan.global_batch, plan.seq_len);
  for (const std::string& note : plan.notes) out += fmt::format("  note: {}\n", note);
  out +=
      "\nModel states per rank (f32 parameters, their gradients, AdamW's two moments; MiB):\n\n"
      "| ranks | stages | parameters | parameters MiB | gradients MiB | optimizer MiB | total MiB "
      "|\n|---|---|---:|---:|---:|---:|---:|\n";
  for (const RankRole& role : plan.roles) {
    const RankModelStates& r = plan.rank(role.ranks.front());
    out += fmt::format("| {} | {} | {} | {} | {} | {} | {} |\n", ranks_str(role.ranks),
                       fmt::join(r.stages, ","), r.parameters, mib(r.parameter_bytes()),
                       mib(r.gradient_bytes()), mib(r.optimizer_bytes()), mib(r.total_bytes()));
  }
  out +=
      "\nNot predicted yet: activations, communication buffers and collectives, step time, "
      "mixed precision's bf16 copies.\n";
  return out;
}

}  // namespace loom::train
