#include "parallel/fsdp/fully_shard.h"

#include <fmt/format.h>

#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "autograd/hooks.h"
#include "base/error.h"
#include "dtensor/dtensor.h"
#include "dtensor/shard_math.h"
#include "parallel/fsdp/flat_layout.h"
#include "tensor/ops.h"

namespace loom::fsdp {

namespace {

// Which unit holds which parameter, and which modules are units: for the errors fully_shard
// promises. Entries of a unit that was destroyed (with its module) are expired weak pointers.
struct ParamEntry {
  std::weak_ptr<TensorImpl> tensor;  // the parameter (whole before sharding, or its shard)
  std::weak_ptr<const std::string> unit;
};

class Unit;

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

// One parameter of a unit: the module slots that hold it and its shard.
struct HeldParam {
  std::string fqn;  // the name under the unit ("h.0.attn.c_attn.weight")
  std::vector<std::pair<nn::Module*, std::string>> slots;  // (owner, name in owner)
  Tensor sharded;  // DTensor Shard(0) on the unit's mesh: the leaf the optimizer sees
  // With tensor parallelism: the parameter's own DTensor layout (on the tp mesh). FSDP then
  // shards its local (TP) shard, and the whole parameter a unit computes with is that local
  // shard gathered, wrapped in this spec again.
  std::optional<DTensorSpec> tp_spec;
  Shape unit_shape;  // what the flat buffers hold whole: the shape, or the TP-local shape
};

class Unit : public std::enable_shared_from_this<Unit> {
 public:
  Unit(std::shared_ptr<const std::string> name, std::shared_ptr<const DeviceMesh> mesh,
       std::vector<HeldParam> params, FSDPOptions options)
      : name_(std::move(name)),
        mesh_(std::move(mesh)),
        params_(std::move(params)),
        options_(options) {
    std::vector<Shape> shapes;
    for (const HeldParam& p : params_) shapes.push_back(p.unit_shape);
    // The last mesh dim shards (dp_shard); a first one, on a 2-D mesh, replicates (HSDP).
    shard_dim_ = mesh_->ndim() - 1;
    layout_ = FlatLayout::make(shapes, static_cast<int>(mesh_->size(shard_dim_)));
    rank_ = static_cast<int>(mesh_->coordinate(shard_dim_));
    if (!params_.empty()) {
      const DType master = params_[0].sharded.dtype();
      dtype_ = options_.mp_policy.param_dtype.value_or(master);
      reduce_dtype_ = options_.mp_policy.reduce_dtype.value_or(dtype_);
      device_ = mesh_->device();
    }
  }

  // All-gathers the unit's parameters and puts the whole ones into the module's slots; in grad
  // mode they are fresh leaves whose gradients reduce_gradients() collects.
  void before_forward() {
    if (params_.empty()) return;
    const bool recording = GradMode::is_enabled();
    NoGradGuard no_grad;  // the communication and copies are not part of any graph
    const std::vector<Tensor> whole = gather();
    std::shared_ptr<Call> call;
    if (recording) {
      call = std::make_shared<Call>();
      call->grads.resize(params_.size());
      // Handles without autograd state onto the whole parameters' memory, to release and refill
      // it (the whole leaves themselves hold the hooks that hold the call: no cycle).
      for (const Tensor& w : whole) call->memory.push_back(ops::alias(w));
    }
    current_call_ = call;
    for (size_t i = 0; i < params_.size(); ++i) {
      // Under TP the whole parameter is the gathered TP shard, as a DTensor on the tp mesh.
      Tensor w =
          params_[i].tp_spec ? make_dtensor(whole[i], with_dtype(*params_[i].tp_spec)) : whole[i];
      if (call && params_[i].sharded.requires_grad()) {
        w.set_requires_grad(true);
        ++call->pending;
        autograd::register_post_accumulate_grad_hook(
            w, [unit = shared_from_this(), call, i](const Tensor& leaf) {
              unit->on_gradient(call, i, leaf);
            });
      }
      for (const auto& [owner, name] : params_[i].slots) owner->set_parameter(name, w);
    }
  }

  // The module's slots hold the shards again. With reshard_after_forward, the whole
  // parameters' memory is released too, and gathered again when backward reaches the unit: a
  // hook on the output's gradient runs just before the unit's own backward.
  void after_forward(const Tensor& output) {
    for (const HeldParam& p : params_) {
      for (const auto& [owner, name] : p.slots) owner->set_parameter(name, p.sharded);
    }
    std::shared_ptr<Call> call = std::move(current_call_);
    if (!options_.reshard_after_forward || !call || call->pending == 0 || !output.defined() ||
        !output.requires_grad()) {
      return;
    }
    for (const Tensor& m : call->memory) m.storage()->release();
    autograd::register_hook(output, [unit = shared_from_this(), call](const Tensor&) {
      unit->refill(*call);
      return Tensor();
    });
  }

 private:
  // One forward call's whole parameters and gradients, collected as backward produces them.
  struct Call {
    std::vector<Tensor> memory;  // aliases of the whole parameters (no autograd state)
    std::vector<Tensor> grads;   // per parameter; undefined until it arrives
    size_t pending = 0;          // gradients still to come
    bool queued = false;         // the end-of-backward check is queued
    bool reduced = false;
  };

  // Gathers the whole parameters into the call's released memory again, before its backward.
  void refill(Call& call) {
    if (call.memory.empty() || !call.memory[0].storage()->released()) return;
    NoGradGuard no_grad;
    const std::vector<Tensor> whole = gather();
    for (size_t i = 0; i < whole.size(); ++i) {
      call.memory[i].storage()->refill();
      ops::copy_(call.memory[i], whole[i]);
    }
  }

  // The TP spec with the whole parameters' dtype (param_dtype under mixed precision).
  DTensorSpec with_dtype(DTensorSpec spec) const {
    spec.dtype = dtype_;
    return spec;
  }

  // A whole parameter's gradient as the flat buffers hold it: itself, or under TP its local
  // shard once laid out as the parameter (a gradient still Partial over tp is reduced first).
  Tensor plain_gradient(size_t i, const Tensor& grad) const {
    if (!params_[i].tp_spec || !grad.defined()) return grad;
    const Placements& want = params_[i].tp_spec->placements;
    const Tensor laid_out = dtensor_spec(grad).placements == want ? grad : redistribute(grad, want);
    return local_shard(laid_out);
  }

  std::vector<Tensor> gather() {
    Tensor send = ops::zeros({layout_.segment_numel}, dtype_, device_);
    for (size_t i = 0; i < params_.size(); ++i) {
      const ParamSlot& slot = layout_.params[i];
      const int64_t rows = slot.rows_of(rank_);
      if (rows == 0) continue;
      ops::copy_(ops::narrow(send, 0, slot.offset, rows * slot.row_numel),
                 ops::reshape(local_shard(params_[i].sharded), {-1}));
    }
    Tensor received = ops::empty({layout_.total_numel()}, dtype_, device_);
    mesh_->group(shard_dim_)->all_gather_into_tensor(received, send)->wait();
    std::vector<Tensor> whole;
    for (const ParamSlot& slot : layout_.params) {
      Tensor w = ops::empty(slot.shape, dtype_, device_);  // the TP-local shape under TP
      const Tensor rows_view = ops::reshape(w, {slot.rows, slot.row_numel});
      for (int r = 0; r < layout_.world; ++r) {
        const int64_t rows = slot.rows_of(r);
        if (rows == 0) continue;
        const Tensor chunk = ops::narrow(received, 0, r * layout_.segment_numel + slot.offset,
                                         rows * slot.row_numel);
        ops::copy_(ops::narrow(rows_view, 0, slot.first_row(r), rows),
                   ops::reshape(chunk, {rows, slot.row_numel}));
      }
      whole.push_back(w);
    }
    return whole;
  }

  void on_gradient(const std::shared_ptr<Call>& call, size_t i, const Tensor& leaf) {
    if (call->reduced) return;
    call->grads[i] = plain_gradient(i, leaf.grad());
    leaf.set_grad(Tensor());  // the whole gradient is only needed until it is reduced
    if (!call->queued) {
      // Parameters the forward did not use get no gradient: reduce with zeros for them once
      // backward is over, so that every rank runs the same collective.
      call->queued = true;
      autograd::queue_backward_callback(
          [unit = shared_from_this(), call] { unit->reduce_gradients(*call); });
    }
    if (--call->pending == 0) reduce_gradients(*call);
  }

  // Reduce-scatters (average over the mesh) the call's gradients and adds each shard into the
  // sharded parameter's .grad. Without gradient sync the whole gradients are kept instead, and
  // the next synchronizing backward reduces their sum with its own: one reduce-scatter per step
  // however many microbatches ran (more memory until then: FSDP2's
  // set_requires_gradient_sync(false)).
  void reduce_gradients(Call& call) {
    if (call.reduced) return;
    call.reduced = true;
    NoGradGuard no_grad;
    if (accumulated_.empty()) accumulated_.resize(params_.size());
    for (size_t i = 0; i < params_.size(); ++i) {
      Tensor& sum = accumulated_[i];
      const Tensor& grad = call.grads[i];
      if (!grad.defined()) continue;
      sum = sum.defined() ? ops::add(sum, grad) : grad;
    }
    call.grads.clear();
    if (!sync_gradients_) return;
    std::vector<Tensor> grads = std::move(accumulated_);
    accumulated_.clear();
    Tensor send = ops::zeros({layout_.total_numel()}, reduce_dtype_, device_);
    for (size_t i = 0; i < params_.size(); ++i) {
      const Tensor& grad = grads[i];
      if (!grad.defined()) continue;
      const ParamSlot& slot = layout_.params[i];
      const Tensor rows_view = ops::reshape(grad, {slot.rows, slot.row_numel});
      for (int r = 0; r < layout_.world; ++r) {
        const int64_t rows = slot.rows_of(r);
        if (rows == 0) continue;
        ops::copy_(ops::reshape(ops::narrow(send, 0, r * layout_.segment_numel + slot.offset,
                                            rows * slot.row_numel),
                                {rows, slot.row_numel}),
                   ops::narrow(rows_view, 0, slot.first_row(r), rows));
      }
    }
    Tensor received = ops::empty({layout_.segment_numel}, reduce_dtype_, device_);
    mesh_->group(shard_dim_)->reduce_scatter_tensor(received, send, comm::ReduceOp::kAvg)->wait();
    // HSDP: the replicas of each shard average their reduced shards.
    if (shard_dim_ > 0) mesh_->group(0)->all_reduce(received, comm::ReduceOp::kAvg)->wait();
    for (size_t i = 0; i < params_.size(); ++i) {
      Tensor& sharded = params_[i].sharded;
      if (!sharded.requires_grad()) continue;
      const ParamSlot& slot = layout_.params[i];
      const DTensorSpec& spec = dtensor_spec(sharded);
      const Tensor local = ops::reshape(
          ops::clone(ops::narrow(received, 0, slot.offset, slot.rows_of(rank_) * slot.row_numel)),
          spec.local_shape());
      const Tensor grad = make_dtensor(local, spec);
      sharded.set_grad(sharded.grad().defined() ? ops::add(sharded.grad(), grad) : grad);
    }
  }

 public:
  void set_requires_gradient_sync(bool sync) { sync_gradients_ = sync; }

 private:
  std::shared_ptr<const std::string> name_;
  std::shared_ptr<const DeviceMesh> mesh_;
  std::vector<HeldParam> params_;
  FSDPOptions options_;
  std::shared_ptr<Call> current_call_;  // between before_forward and after_forward
  bool sync_gradients_ = true;
  std::vector<Tensor> accumulated_;  // whole gradients of backwards run without sync
  FlatLayout layout_;
  int64_t shard_dim_ = 0;          // the mesh dim that shards
  int rank_ = 0;                   // this rank's coordinate on it
  DType dtype_ = kFloat32;         // the whole parameters' and the all-gather's (param_dtype)
  DType reduce_dtype_ = kFloat32;  // the reduce-scatter's
  Device device_ = Device::cpu();
};

// The parameters `module` holds for a new unit: its own and its submodules', minus those of
// submodules that are units already. Checks each, naming the unit and the parameter.
std::vector<HeldParam> collect(nn::Module& module, const std::string& unit,
                               const DeviceMesh& mesh) {
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
      LOOM_CHECK(value.device() == mesh.device(),
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
  std::vector<HeldParam> params = collect(module, name, *mesh);
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
  {
    Registry& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mutex);
    reg.unit_objects[&module] = unit;
  }
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
    for (const auto& [unused, sub] : module.named_modules()) {
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
