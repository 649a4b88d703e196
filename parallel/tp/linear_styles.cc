// ColwiseParallel and RowwiseParallel on nn::Linear.
#include "autograd/grad_mode.h"
#include "base/error.h"
#include "dtensor/dtensor.h"
#include "nn/linear.h"
#include "parallel/tp/style.h"

namespace loom::tp {

namespace {

nn::Linear& as_linear(nn::Module& module, const std::string& fqn, const std::string& style) {
  auto* linear = dynamic_cast<nn::Linear*>(&module);
  LOOM_CHECK(linear != nullptr, "parallelize_module: {} applies to Linear modules, but '{}' is a {}", style, fqn,
             module.type_name());
  return *linear;
}

// Replaces parameter `name` with a DTensor (distributed from rank 0's values), keeping
// requires_grad.
void shard_parameter(nn::Module& module, const std::string& name, const std::shared_ptr<const DeviceMesh>& mesh,
                     const Placement& placement) {
  const Tensor& current = module.parameter(name);
  if (!current.defined()) return;
  NoGradGuard no_grad;
  Tensor sharded = distribute_tensor(current, mesh, {placement});
  sharded.set_requires_grad(true);
  module.set_parameter(name, sharded);
}

// Inputs: plain tensors are wrapped as `input_layout`, then redistributed to `desired`. The
// global size of the last dim is the Linear's in_features, which keeps uneven shards right
// (from_local would otherwise assume even ones).
void install_input_hook(nn::Module& module, std::shared_ptr<const DeviceMesh> mesh, Placement input_layout,
                        Placement desired, int64_t in_features) {
  module.register_forward_pre_hook([mesh, input_layout, desired, in_features](nn::Module&, const Tensor& input) {
    Tensor x = input;
    if (!is_dtensor(input)) {
      Shape global = input.shape();
      if (!global.empty()) global.back() = in_features;
      // Any other sharded dim is taken to be split evenly, as from_local does.
      if (input_layout.is_shard() && !global.empty()) {
        const int64_t d = input_layout.dim() < 0 ? input_layout.dim() + static_cast<int64_t>(global.size())
                                                 : input_layout.dim();
        if (d != static_cast<int64_t>(global.size()) - 1) global[d] *= mesh->size(0);
      }
      x = from_local(input, mesh, {input_layout}, global);
    }
    return dtensor_spec(x).placements == Placements{desired} ? x : redistribute(x, {desired});
  });
}

void install_output_hook(nn::Module& module, Placement output_layout, bool use_local_output) {
  module.register_forward_hook([output_layout, use_local_output](nn::Module&, const Tensor&, const Tensor& output) {
    Tensor y = dtensor_spec(output).placements == Placements{output_layout} ? output : redistribute(output, {output_layout});
    return use_local_output ? to_local(y) : y;
  });
}

void check_one_dim(const DeviceMesh& mesh, const std::string& style) {
  LOOM_CHECK(mesh.ndim() == 1, "parallelize_module: {} needs a 1-D mesh (e.g. mesh[\"tp\"]), got {}", style, mesh.str());
}

}  // namespace

void ColwiseParallel::apply(nn::Module& module, const std::string& fqn, std::shared_ptr<const DeviceMesh> mesh) const {
  check_one_dim(*mesh, name());
  as_linear(module, fqn, name());
  shard_parameter(module, "weight", mesh, Shard(0));
  shard_parameter(module, "bias", mesh, Shard(0));
  install_input_hook(module, mesh, options_.input_layouts.value_or(Replicate()), Replicate(),
                     as_linear(module, fqn, name()).in_features());
  install_output_hook(module, options_.output_layouts.value_or(Shard(-1)), options_.use_local_output);
}

void RowwiseParallel::apply(nn::Module& module, const std::string& fqn, std::shared_ptr<const DeviceMesh> mesh) const {
  check_one_dim(*mesh, name());
  as_linear(module, fqn, name());
  shard_parameter(module, "weight", mesh, Shard(1));
  shard_parameter(module, "bias", mesh, Replicate());
  install_input_hook(module, mesh, options_.input_layouts.value_or(Shard(-1)), Shard(-1),
                     as_linear(module, fqn, name()).in_features());
  install_output_hook(module, options_.output_layouts.value_or(Replicate()), options_.use_local_output);
}

}  // namespace loom::tp
