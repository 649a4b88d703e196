#include "parallel/fsdp/fully_shard.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "base/error.h"
#include "dtensor/dtensor.h"
#include "dtensor/shard_math.h"
#include "parallel/fsdp/unit.h"
#include "tensor/ops.h"

namespace loom::fsdp {

namespace {

// Which unit holds which parameter, and which modules are units: for the errors fully_shard
// promises. Entries of a unit that was destroyed (with its module) are expired weak pointers.
struct ParamEntry {
  std::weak_ptr<TensorImpl> tensor;  // the parameter (whole before sharding, or its shard)
  std::weak_ptr<const std::string> unit;
};

struct Registry {
  std::mutex mutex;
  // Modules that are units -> their Unit (for set_requires_gradient_sync).
  std::unordered_map<const nn::Module*, std::weak_ptr<Unit>> unit_objects;
  // Parameters -> the unit holding them. An entry counts only while both the tensor and the
  // unit live, so a freed tensor's address reused by another is never mistaken for it.
  std::unordered_map<const TensorImpl*, ParamEntry> params;
  std::unordered_map<const nn::Module*, std::weak_ptr<const std::string>> units;
};

Registry& registry() {
  static Registry instance;
  return instance;
}

std::optional<std::string> param_holder(const Registry& reg, const Tensor& param) {
  const auto it = reg.params.find(param.impl());
  if (it == reg.params.end() || it->second.tensor.lock().get() != param.impl()) {
    return std::nullopt;
  }
  const auto name = it->second.unit.lock();
  return name ? std::optional<std::string>(*name) : std::nullopt;
}

std::optional<std::string> unit_holder(const Registry& reg, const nn::Module* module) {
  const auto it = reg.units.find(module);
  if (it == reg.units.end()) return std::nullopt;
  const auto name = it->second.lock();
  return name ? std::optional<std::string>(*name) : std::nullopt;
}

// The parameters `module` holds for a new unit: its own and its submodules', minus those of
// submodules that are units already. Checks each, naming the unit and the parameter.
std::vector<HeldParam> collect(nn::Module& module, const std::string& unit, const DeviceMesh& mesh,
                               const std::vector<Tensor>& ignored) {
  std::vector<HeldParam> params;
  std::unordered_map<const TensorImpl*, size_t> index;  // a parameter shared by two slots
  std::unordered_set<const nn::Module*> skipped;        // nested units' subtrees
  Registry& reg = registry();
  for (const auto& [prefix, sub] : module.named_modules()) {
    if (sub != &module && (skipped.count(sub) || is_fully_sharded(*sub))) {
      for (const auto& [unused, inner] : sub->named_modules()) skipped.insert(inner);
      continue;
    }
    for (const auto& [name, value] : sub->named_parameters(/*recurse=*/false)) {
      if (!value.defined()) continue;
      const bool skip = std::any_of(ignored.begin(), ignored.end(),
                                    [&](const Tensor& t) { return t.impl() == value.impl(); });
      if (skip) continue;
      const std::string fqn = prefix.empty() ? name : prefix + "." + name;
      {
        std::lock_guard<std::mutex> lock(reg.mutex);
        if (auto other = param_holder(reg, value)) {
          LOOM_FAIL(
              "fully_shard({}): parameter '{}' is already in FSDP unit '{}'; a parameter "
              "belongs to one unit: shard a module that holds every user of it",
              unit, fqn, *other);
        }
      }
      const auto it = index.find(value.impl());
      if (it != index.end()) {
        params[it->second].slots.emplace_back(sub, name);
        continue;
      }
      std::optional<DTensorSpec> tp_spec;
      if (is_dtensor(value)) {
        tp_spec = dtensor_spec(value);
        LOOM_CHECK(!tp_spec->has_partial(),
                   "fully_shard({}): parameter '{}' is Partial ({}); a parameter must be Shard or "
                   "Replicate on its mesh",
                   unit, fqn, tp_spec->str());
      }
      const Shape unit_shape = tp_spec ? tp_spec->local_shape() : value.shape();
      LOOM_CHECK(!unit_shape.empty(),
                 "fully_shard({}): parameter '{}' is 0-dim; FSDP shards dim 0 (give it shape (1))",
                 unit, fqn);
      // A meta parameter (nn/meta_init.h) is sharded as a placeholder and materialized after.
      LOOM_CHECK(value.device() == mesh.device() || value.device().is_meta(),
                 "fully_shard({}): parameter '{}' is on {} but the mesh's groups work on {}; move "
                 "the module there first (Module::to)",
                 unit, fqn, value.device().str(), mesh.device().str());
      if (!params.empty()) {
        const Tensor& first = params[0].sharded;
        LOOM_CHECK(value.dtype() == first.dtype(),
                   "fully_shard({}): parameter '{}' is {} but '{}' is {}; a unit's parameters "
                   "share one flat buffer and so one dtype",
                   unit, fqn, dtype_name(value.dtype()), params[0].fqn, dtype_name(first.dtype()));
      }
      index.emplace(value.impl(), params.size());
      params.push_back({fqn, {{sub, name}}, value, tp_spec, unit_shape});
    }
  }
  return params;
}

}  // namespace

bool is_fully_sharded(const nn::Module& module) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  return unit_holder(reg, &module).has_value();
}

void fully_shard(nn::Module& module, std::shared_ptr<const DeviceMesh> mesh, FSDPOptions options,
                 std::string name) {
  if (name.empty()) name = module.type_name();
  LOOM_CHECK(mesh != nullptr, "fully_shard({}): the mesh is null", name);
  LOOM_CHECK(mesh->ndim() == 1 || mesh->ndim() == 2,
             "fully_shard({}): needs a 1-D mesh (dp_shard, e.g. mesh[\"dp_shard\"]) or a 2-D one "
             "(dp_replicate, dp_shard: HSDP), got {}",
             name, mesh->str());
  LOOM_CHECK(!is_fully_sharded(module), "fully_shard({}): the module is already fully sharded",
             name);
  std::vector<HeldParam> params = collect(module, name, *mesh, options.ignored_params);
  // The whole parameters, registered too: a module outside the unit that still holds one (a
  // shared slot) is named if it is sharded into another unit.
  std::vector<Tensor> originals;
  // Shard: every rank holds the same whole parameter (same seeds), so each keeps its chunk with
  // no communication.
  {
    NoGradGuard no_grad;
    const Placements fsdp_placements =
        mesh->ndim() == 1 ? Placements{Shard(0)} : Placements{Replicate(), Shard(0)};
    const int64_t shard_dim = mesh->ndim() - 1;
    // One (tp..., dp...) mesh per TP mesh, shared by its parameters.
    std::unordered_map<const DeviceMesh*, std::shared_ptr<const DeviceMesh>> joined;
    for (HeldParam& p : params) {
      const Tensor whole = p.sharded;
      originals.push_back(whole);
      // The sharded parameter's layout. Under TP it lives on the (tp..., dp...) mesh: placements
      // apply in mesh-dim order, so Shard(0) on dp_shard after the TP placement splits the TP
      // shard's rows again, exactly as the flat buffers do (torch's _StridedShard, in plain
      // placements).
      DTensorSpec spec{mesh, fsdp_placements, whole.shape(), whole.dtype()};
      if (p.tp_spec) {
        try {
          auto& m = joined[p.tp_spec->mesh.get()];
          if (!m)
            m = std::make_shared<const DeviceMesh>(
                DeviceMesh::concatenate({*p.tp_spec->mesh, *mesh}));
          spec.mesh = m;
        } catch (const Error& e) {
          LOOM_FAIL(
              "fully_shard({}): parameter '{}' is a DTensor on {}, which does not combine with "
              "the FSDP mesh {} ({}); slice both meshes from the job's mesh",
              name, p.fqn, p.tp_spec->mesh->str(), mesh->str(), e.what());
        }
        spec.placements = p.tp_spec->placements;
        spec.placements.insert(spec.placements.end(), fsdp_placements.begin(),
                               fsdp_placements.end());
      }
      // Every rank holds the same whole (or TP-local) parameter (same seeds), so each keeps its
      // rows with no communication.
      const Tensor unit_local = p.tp_spec ? local_shard(whole) : whole;
      const ShardRange rows =
          shard_range(p.unit_shape[0], mesh->size(shard_dim), mesh->coordinate(shard_dim));
      Tensor shard = make_dtensor(
          ops::clone(ops::narrow(detach(unit_local), 0, rows.offset, rows.size)), spec);
      shard.set_requires_grad(whole.requires_grad());
      p.sharded = shard;
      for (const auto& [owner, slot] : p.slots) owner->set_parameter(slot, shard);
    }
  }
  auto unit_name = std::make_shared<const std::string>(name);
  {
    Registry& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mutex);
    reg.units[&module] = unit_name;
    for (const HeldParam& p : params)
      reg.params[p.sharded.impl()] = {p.sharded.impl_ptr(), unit_name};
    for (const Tensor& whole : originals) reg.params[whole.impl()] = {whole.impl_ptr(), unit_name};
  }
  auto unit = std::make_shared<Unit>(unit_name, std::move(mesh), std::move(params), options);
  // The units inside this module join its group, which this unit owns (the root: its forward
  // starts each pass), so their gathers prefetch in forward order.
  auto group = std::make_shared<UnitGroup>();
  {
    Registry& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mutex);
    for (nn::Module* sub : module.modules()) {
      if (sub == &module) continue;
      const auto it = reg.unit_objects.find(sub);
      if (it == reg.unit_objects.end()) continue;
      if (auto inner = it->second.lock()) {
        inner->join(group);
        group->members.push_back(inner);
      }
    }
    group->members.push_back(unit);
    group->owner = unit.get();
    reg.unit_objects[&module] = unit;
  }
  unit->join(group);
  const MixedPrecisionPolicy mp = options.mp_policy;
  module.register_forward_pre_hook([unit, mp](nn::Module&, const Tensor& input) {
    unit->before_forward();
    if (mp.param_dtype && mp.cast_forward_inputs && input.defined() && is_floating(input.dtype()) &&
        input.dtype() != *mp.param_dtype) {
      return to(input, *mp.param_dtype);  // differentiable: the input's gradient comes back
    }
    return input;
  });
  module.register_forward_hook([unit, mp](nn::Module&, const Tensor&, const Tensor& output) {
    unit->after_forward(output);
    if (mp.output_dtype && output.defined() && is_floating(output.dtype()) &&
        output.dtype() != *mp.output_dtype) {
      return to(output, *mp.output_dtype);
    }
    return output;
  });
}

void set_requires_gradient_sync(nn::Module& module, bool sync) {
  std::vector<std::shared_ptr<Unit>> units;
  {
    Registry& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mutex);
    for (nn::Module* sub : module.modules()) {
      const auto it = reg.unit_objects.find(sub);
      if (it == reg.unit_objects.end()) continue;
      if (auto unit = it->second.lock()) units.push_back(std::move(unit));
    }
  }
  LOOM_CHECK(!units.empty(),
             "set_requires_gradient_sync({}): neither the module nor any submodule is fully "
             "sharded; call fully_shard first",
             module.type_name());
  for (const auto& unit : units) unit->set_requires_gradient_sync(sync);
}

}  // namespace loom::fsdp
