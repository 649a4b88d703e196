#include "dtensor/sharding/propagator.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

#include "autograd/grad_mode.h"
#include "base/error.h"
#include "dtensor/dtensor.h"
#include "dtensor/redistribute.h"
#include "dtensor/sharding/strategy.h"
#include "tensor/attention_attrs.h"
#include "tensor/flop_counter.h"
#include "tensor/memory_stats.h"
#include "tensor/ops_create.h"

namespace loom::sharding {

namespace {

struct Decision {
  OpSharding sharding;
  std::vector<size_t> chosen;  // option index per mesh dim
  // What `chosen` means per input and per output: the placements over the mesh dims.
  std::vector<Placements> input_placements, output_placements;
};

// Keys are byte strings; lookups pass a view of the thread's key words (no string is built for
// a cached op).
struct KeyHash {
  using is_transparent = void;
  // Keys are whole 64-bit words: two independent multiply lanes (the multiply's latency, not the
  // key's length, bounds a serial hash), folded at the end.
  size_t operator()(std::string_view key) const {
    constexpr uint64_t kOdd = 0x9E3779B97F4A7C15ull;
    const size_t words = key.size() / sizeof(uint64_t);
    uint64_t lanes[2] = {key.size(), kOdd};
    for (size_t i = 0; i < words; ++i) {
      uint64_t word;
      std::memcpy(&word, key.data() + i * sizeof word, sizeof word);
      lanes[i & 1] = (lanes[i & 1] ^ word) * kOdd;
    }
    uint64_t h = lanes[0] ^ ((lanes[1] << 31) | (lanes[1] >> 33));
    h ^= h >> 29;
    h *= kOdd;
    return h ^ (h >> 32);
  }
};

// Per thread: rank threads of one process each keep their own (their meshes differ).
thread_local std::unordered_map<std::string, Decision, KeyHash, std::equal_to<>> cache;
thread_local PropagationStats stats;

// The cache key is packed 64-bit words (no formatting: it is built on every DTensor op, and
// formatting was most of a cached op's dispatch time). Each variable-length part starts with
// its length, so two different calls never pack to the same words.
using KeyWords = std::vector<int64_t>;

void put(KeyWords& key, int64_t word) { key.push_back(word); }

void put_all(KeyWords& key, const std::vector<int64_t>& words) {
  put(key, static_cast<int64_t>(words.size()));
  key.insert(key.end(), words.begin(), words.end());
}

std::string_view key_bytes(const KeyWords& key) {
  return {reinterpret_cast<const char*>(key.data()), key.size() * sizeof(int64_t)};
}

void append_attr(KeyWords& key, const OpAttr& attr) {
  put(key, static_cast<int64_t>(attr.index()));  // the alternative held
  std::visit(
      [&](const auto& value) {
        using V = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<V, std::vector<int64_t>>) {
          put_all(key, value);
        } else if constexpr (std::is_same_v<V, DType>) {
          put(key, static_cast<int64_t>(value));
        } else if constexpr (std::is_same_v<V, double>) {
          // Scalars (learning rates, clip scales) change every step; strategies may branch only on
          // whether one is zero (masked_fill) or negative (mul_ on a Partial(max)), so that is all
          // the key keeps. Local ops still get the real value from the call.
          put(key, value == 0.0 ? 0 : value > 0.0 ? 1 : 2);
        } else {
          put(key, static_cast<int64_t>(value));
        }
      },
      attr);
}

// Random seeds among an op's attrs (dropout's, attention dropout's): new on every call and read by
// no strategy, so the key leaves them out; keyed, a training run would add a cache entry per call.
bool is_seed_attr(OpId op, size_t index) {
  switch (op) {
    case OpId::dropout:
      return index == 1;
    case OpId::scaled_dot_product_attention:
      return index == ops::kAttentionDropoutAttrs + 1;
    case OpId::scaled_dot_product_attention_backward:
      return index == ops::kAttentionBackwardDropoutAttrs + 1;
    default:
      return false;
  }
}

// Packs the key into `key` (cleared first; a thread's buffer is reused, so a cached op allocates
// nothing for its key).
void cache_key(const OpCall& call, std::span<const DTensorSpec* const> specs,
               const DeviceMesh& mesh, KeyWords& key) {
  key.clear();
  put(key, static_cast<int64_t>(call.id));
  // The mesh's sizes, not its address: decisions depend on nothing else about it, and a freed
  // mesh's address may come back for a mesh of other sizes.
  put_all(key, mesh.shape());
  put(key, static_cast<int64_t>(specs.size()));
  for (const auto& spec : specs) {
    if (!spec) {
      put(key, -1);
      continue;
    }
    put_all(key, spec->shape);
    put(key, static_cast<int64_t>(spec->placements.size()));
    for (const Placement& p : spec->placements) {
      // Kind, then the shard dim or the reduction (what operator== compares).
      put(key, static_cast<int64_t>(p.kind()));
      put(key, p.is_shard() ? p.dim() : p.is_partial() ? static_cast<int64_t>(p.reduce_op()) : 0);
    }
    put(key, static_cast<int64_t>(spec->dtype));
  }
  put(key, static_cast<int64_t>(call.attrs.size()));
  for (size_t i = 0; i < call.attrs.size(); ++i) {
    if (is_seed_attr(call.id, i)) {
      put(key, -2);
      continue;
    }
    append_attr(key, call.attrs[i]);
  }
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

namespace {

// The plain op on the inputs' global shapes (meta tensors: shapes, no data), so that its own
// checks refuse what does not fit, on every rank alike: a rank's shards may fit where the whole
// does not (a contraction or a concatenation whose sizes differ in a sharded dim), and then only
// some ranks would fail while the others went on to wait for them. Once per decision (the cache
// keeps what passed).
void check_global_shapes(const OpCall& call, const InputSpecs& specs) {
  // It counts nowhere: its placeholders not in the rank's memory nor in a traced step's, its
  // products not in the step's FLOPs. (A dispatch mode does not see it: the DTensor handler runs
  // inside the mode's call.)
  MemoryTracker uncounted;
  ScopedMetaPlaceholderTracker placeholders(uncounted);
  FlopCounter::Paused not_the_steps;
  std::vector<Tensor> globals(call.inputs.size());
  for (size_t i = 0; i < globals.size(); ++i) {
    if (!specs[i].has_value()) continue;  // an absent optional input (a bias)
    globals[i] = ops::empty(specs[i]->shape, specs[i]->dtype, Device::meta());
  }
  NoGradGuard no_grad;
  call_op(OpCall(call.id, std::move(globals), call.attrs));
}

}  // namespace

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
  // The inputs' specs by pointer (a cached op copies none); plain 0-dim inputs' replicated specs
  // live in `scalar_specs` (reserved once for every input: the pointers stay valid).
  const size_t count = call.inputs.size();
  // On the stack for the usual few inputs: a cached op should allocate little besides its outputs.
  std::array<const DTensorSpec*, 8> few_specs{};
  std::vector<const DTensorSpec*> many_specs(count > few_specs.size() ? count : 0, nullptr);
  const std::span<const DTensorSpec*> spec_of =
      count > few_specs.size() ? std::span<const DTensorSpec*>(many_specs)
                               : std::span<const DTensorSpec*>(few_specs.data(), count);
  std::vector<DTensorSpec> scalar_specs;  // reserved at its first use, before any pointer
  std::vector<Tensor> locals(count);
  for (size_t i = 0; i < count; ++i) {
    const Tensor& t = call.inputs[i];
    if (!t.defined()) continue;
    if (is_dtensor(t)) {
      spec_of[i] = &dtensor_spec(t);
      locals[i] = local_shard(t);
    } else {
      LOOM_CHECK(t.dim() == 0,
                 "{}: input {} is a plain tensor {} while other inputs are DTensors on {}; make it "
                 "a DTensor "
                 "with distribute_tensor or from_local",
                 call.op, i, t.description(), mesh->str());
      if (scalar_specs.capacity() == 0) scalar_specs.reserve(count);
      spec_of[i] = &scalar_specs.emplace_back(
          DTensorSpec{mesh_ptr, Placements(mesh->ndim(), Replicate()), {}, t.dtype()});
      locals[i] = t;
    }
  }
  // The specs as strategies take them (copies): on a cache miss, or for an op with its own
  // local function.
  const auto copy_specs = [&] {
    InputSpecs specs(count);
    for (size_t i = 0; i < count; ++i) {
      if (spec_of[i] != nullptr) specs[i] = *spec_of[i];
    }
    return specs;
  };

  // 2. The decision: cached, or from the op's strategy.
  thread_local KeyWords key;
  cache_key(call, spec_of, *mesh, key);
  auto it = cache.find(key_bytes(key));
  if (it == cache.end()) {
    ++stats.cache_misses;
    // The key is the thread's buffer, which a nested DTensor op would overwrite: keep a copy
    // for the insertion below (misses are rare).
    const std::string miss_key(key_bytes(key));
    const InputSpecs specs = copy_specs();
    const StrategyFn& strategy = strategy_table()[call.id];
    LOOM_CHECK(
        strategy != nullptr,
        "{}: no sharding strategy for DTensor inputs ({}); this op is not supported on DTensors",
        call.op, describe_inputs(specs));
    check_global_shapes(call, specs);
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
    const auto placements_of = [&](auto member, size_t index) {
      Placements placements;
      for (int64_t md = 0; md < mesh->ndim(); ++md)
        placements.push_back((decision.sharding.options[decision.chosen[md]].*member)[index]);
      return placements;
    };
    for (size_t i = 0; i < specs.size(); ++i)
      decision.input_placements.push_back(placements_of(&DimOption::inputs, i));
    for (size_t j = 0; j < decision.sharding.output_shapes.size(); ++j)
      decision.output_placements.push_back(placements_of(&DimOption::outputs, j));
    it = cache.emplace(miss_key, std::move(decision)).first;
  } else {
    ++stats.cache_hits;
  }
  const Decision& decision = it->second;

  // 3. Redistribute inputs to the chosen placements (plain: the differentiable op that called
  //    us records its own backward).
  NoGradGuard no_grad;
  // The specs after redistribution: a copy only when some input moves.
  std::optional<InputSpecs> moved;
  for (size_t i = 0; i < count; ++i) {
    // 0-dim inputs move too: a Partial scalar may need its reduction, and a replicated scalar
    // (or plain 0-dim tensor) taken as Partial must be counted once, not once per rank.
    if (spec_of[i] == nullptr) continue;
    const Placements& target = decision.input_placements[i];
    if (target != spec_of[i]->placements) {
      locals[i] = redistribute_local(locals[i], *spec_of[i], target);
      if (!moved) moved = copy_specs();
      (*moved)[i]->placements = target;
    }
  }

  // 4. The local op, then wrap the outputs.
  OpCall local_call(call.id, std::move(locals), call.attrs);
  std::vector<Tensor> outputs;
  if (decision.sharding.local) {
    outputs = decision.sharding.local(local_call, moved ? *moved : copy_specs());
  } else {
    outputs = call_op(local_call);
  }
  LOOM_INTERNAL_ASSERT(outputs.size() == decision.sharding.output_shapes.size(),
                       "{}: {} local outputs for {} shapes", call.op, outputs.size(),
                       decision.sharding.output_shapes.size());
  for (size_t j = 0; j < outputs.size(); ++j) {
    if (!outputs[j].defined()) continue;  // an optional output the op did not produce
    outputs[j] = make_dtensor(std::move(outputs[j]),
                              DTensorSpec{mesh_ptr, decision.output_placements[j],
                                          decision.sharding.output_shapes[j], outputs[j].dtype()});
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
