#include "dtensor/sharding/propagator.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unordered_map>

#include "autograd/grad_mode.h"
#include "base/error.h"
#include "dtensor/dtensor.h"
#include "dtensor/redistribute.h"
#include "dtensor/sharding/strategy.h"

namespace loom::sharding {

namespace {

struct Decision {
  OpSharding sharding;
  std::vector<size_t> chosen;  // option index per mesh dim
};

// Per thread: rank threads of one process each keep their own (their meshes differ).
thread_local std::unordered_map<std::string, Decision> cache;
thread_local PropagationStats stats;

void append_attr(std::string& key, const OpAttr& attr) {
  std::visit(
      [&](const auto& value) {
        using V = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<V, std::vector<int64_t>>) {
          key += fmt::format("[{}]", fmt::join(value, ","));
        } else if constexpr (std::is_same_v<V, DType>) {
          key += dtype_name(value);
        } else if constexpr (std::is_same_v<V, double>) {
          // Scalars (learning rates, clip scales) change every step; strategies may branch only on
          // whether one is zero (masked_fill), so that is all the key keeps. Local ops still get
          // the real value from the call.
          key += value == 0.0 ? "0" : "x";
        } else {
          key += fmt::format("{}", value);
        }
        key += ';';
      },
      attr);
}

std::string cache_key(const OpCall& call, const InputSpecs& specs, const DeviceMesh& mesh) {
  std::string key(call.op);
  // The mesh's sizes, not its address: decisions depend on nothing else about it, and a freed
  // mesh's address may come back for a mesh of other sizes.
  key += fmt::format("@{}|", fmt::join(mesh.shape(), "x"));
  for (const auto& spec : specs) {
    if (!spec) {
      key += "_|";
      continue;
    }
    key += shape_str(spec->shape);
    key += placements_compact(spec->placements);
    key += dtype_name(spec->dtype);
    key += '|';
  }
  for (const OpAttr& attr : call.attrs) append_attr(key, attr);
  return key;
}

// Bytes a transition on one mesh dim moves, roughly (what the choice minimizes).
double transition_bytes(const Placement& from, const Placement& to, double local_bytes,
                        int64_t count) {
  if (to.is_replicate()) return from.is_shard() ? local_bytes * (count - 1) : 2 * local_bytes;
  if (to.is_shard()) return from.is_replicate() ? 0.001 * local_bytes : local_bytes;
  // -> Partial
  return from.is_replicate() ? 0.001 * local_bytes : 2 * local_bytes * count;
}

double transition_cost(const Placement& from, const Placement& to, double local_bytes,
                       int64_t count) {
  if (from == to) return 0;
  // Any change costs at least 1, so ties (e.g. on a mesh dim of size 1) keep inputs as they are.
  return 1 + transition_bytes(from, to, local_bytes, count);
}

std::string describe_inputs(const InputSpecs& specs) {
  std::vector<std::string> parts;
  for (const auto& spec : specs) {
    parts.push_back(
        spec ? fmt::format("{} {}", shape_str(spec->shape), placements_str(spec->placements))
             : "none");
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace

PropagationStats propagation_stats() { return stats; }
void clear_propagation_cache() {
  cache.clear();
  stats = {};
}

std::vector<Tensor> dispatch_dtensor_op(const OpCall& call) {
  // 1. The inputs' specs, on one mesh. 0-dim plain tensors (scalars in backward formulas) count
  //    as replicated; other plain tensors are an error.
  const DeviceMesh* mesh = nullptr;
  std::shared_ptr<const DeviceMesh> mesh_ptr;
  for (const Tensor& t : call.inputs) {
    if (!is_dtensor(t)) continue;
    const DTensorSpec& spec = dtensor_spec(t);
    if (mesh == nullptr) {
      mesh = spec.mesh.get();
      mesh_ptr = spec.mesh;
    } else {
      LOOM_CHECK(mesh == spec.mesh.get() || *mesh == *spec.mesh,
                 "{}: DTensor inputs live on different meshes: {} and {}", call.op, mesh->str(),
                 spec.mesh->str());
    }
  }
  LOOM_INTERNAL_ASSERT(mesh != nullptr, "{} dispatched to DTensor without a DTensor input",
                       call.op);
  InputSpecs specs(call.inputs.size());
  std::vector<Tensor> locals(call.inputs.size());
  for (size_t i = 0; i < call.inputs.size(); ++i) {
    const Tensor& t = call.inputs[i];
    if (!t.defined()) continue;
    if (is_dtensor(t)) {
      specs[i] = dtensor_spec(t);
      locals[i] = local_shard(t);
    } else {
      LOOM_CHECK(t.dim() == 0,
                 "{}: input {} is a plain tensor {} while other inputs are DTensors on {}; make it "
                 "a DTensor "
                 "with distribute_tensor or from_local",
                 call.op, i, t.description(), mesh->str());
      specs[i] = DTensorSpec{mesh_ptr, Placements(mesh->ndim(), Replicate()), {}, t.dtype()};
      locals[i] = t;
    }
  }

  // 2. The decision: cached, or from the op's strategy.
  const std::string key = cache_key(call, specs, *mesh);
  auto it = cache.find(key);
  if (it == cache.end()) {
    ++stats.cache_misses;
    const StrategyFn& strategy = strategy_table()[call.id];
    LOOM_CHECK(
        strategy != nullptr,
        "{}: no sharding strategy for DTensor inputs ({}); this op is not supported on DTensors",
        call.op, describe_inputs(specs));
    Decision decision{strategy(call, specs), {}};
    LOOM_CHECK(!decision.sharding.options.empty(), "{}: no sharding strategy accepts inputs ({})",
               call.op, describe_inputs(specs));
    const std::vector<int64_t> first_coordinate(mesh->ndim(), 0);
    for (int64_t md = 0; md < mesh->ndim(); ++md) {
      double best = -1;
      size_t best_index = 0;
      for (size_t o = 0; o < decision.sharding.options.size(); ++o) {
        const DimOption& option = decision.sharding.options[o];
        bool moves_fixed = false;
        for (size_t i : decision.sharding.fixed_inputs) {
          moves_fixed |= specs[i] && !specs[i]->shape.empty() &&
                         !(option.inputs[i] == specs[i]->placements[md]);
        }
        if (moves_fixed) continue;
        double cost = 0;
        for (size_t i = 0; i < specs.size(); ++i) {
          if (!specs[i]) continue;
          // The shard at mesh coordinate 0 (the largest), not this rank's: every rank must make the
          // same choice, and with uneven shards a rank holding an empty shard would find moving
          // it free.
          const double bytes =
              static_cast<double>(shape_numel(specs[i]->local_shape_at(first_coordinate))) *
              element_size(specs[i]->dtype);
          cost +=
              transition_cost(specs[i]->placements[md], option.inputs[i], bytes, mesh->size(md));
        }
        if (best < 0 || cost < best) {
          best = cost;
          best_index = o;
        }
      }
      LOOM_CHECK(best >= 0, "{}: no sharding strategy accepts inputs ({}) on mesh dim {} ('{}')",
                 call.op, describe_inputs(specs), md, mesh->dim_names()[md]);
      decision.chosen.push_back(best_index);
    }
    it = cache.emplace(key, std::move(decision)).first;
  } else {
    ++stats.cache_hits;
  }
  const Decision& decision = it->second;

  // 3. Redistribute inputs to the chosen placements (plain: the differentiable op that called
  //    us records its own backward).
  NoGradGuard no_grad;
  InputSpecs after = specs;
  for (size_t i = 0; i < specs.size(); ++i) {
    // 0-dim inputs move too: a Partial scalar may need its reduction, and a replicated scalar
    // (or plain 0-dim tensor) taken as Partial must be counted once, not once per rank.
    if (!specs[i]) continue;
    Placements target;
    for (int64_t md = 0; md < mesh->ndim(); ++md)
      target.push_back(decision.sharding.options[decision.chosen[md]].inputs[i]);
    if (target != specs[i]->placements) {
      locals[i] = redistribute_local(locals[i], *specs[i], target);
      after[i]->placements = target;
    }
  }

  // 4. The local op, then wrap the outputs.
  OpCall local_call(call.id, locals, call.attrs);
  std::vector<Tensor> outputs =
      decision.sharding.local ? decision.sharding.local(local_call, after) : call_op(local_call);
  LOOM_INTERNAL_ASSERT(outputs.size() == decision.sharding.output_shapes.size(),
                       "{}: {} local outputs for {} shapes", call.op, outputs.size(),
                       decision.sharding.output_shapes.size());
  for (size_t j = 0; j < outputs.size(); ++j) {
    if (!outputs[j].defined()) continue;  // an optional output the op did not produce
    Placements placements;
    for (int64_t md = 0; md < mesh->ndim(); ++md)
      placements.push_back(decision.sharding.options[decision.chosen[md]].outputs[j]);
    outputs[j] = make_dtensor(
        outputs[j],
        DTensorSpec{mesh_ptr, placements, decision.sharding.output_shapes[j], outputs[j].dtype()});
  }
  return outputs;
}

void install_dtensor_dispatch() {
  static const bool installed = [] {
    register_dispatch_handler(kDTensorExtensionKind, dispatch_dtensor_op);
    return true;
  }();
  (void)installed;
}

}  // namespace loom::sharding
