#include "parallel/tp/layouts.h"

#include "autograd/grad_mode.h"
#include "base/error.h"
#include "dtensor/dtensor.h"

namespace loom::tp {

void check_one_dim(const DeviceMesh& mesh, const std::string& style) {
  LOOM_CHECK(mesh.ndim() == 1,
             "parallelize_module: {} needs a 1-D mesh (the tensor-parallel dim's slice), got {}",
             style, mesh.str());
}

void check_parameter(const nn::Module& module, const std::string& fqn, const std::string& name,
                     const DeviceMesh& mesh, const Placement& placement, const std::string& style,
                     bool required) {
  if (!module.has_parameter(name)) {
    LOOM_CHECK(!required,
               "parallelize_module: {} on '{}' ({}) shards its '{}', which it does not "
               "have",
               style, fqn, module.type_name(), name);
    return;
  }
  const Tensor& current = module.parameter(name);
  if (!is_dtensor(current)) return;
  const DTensorSpec& spec = dtensor_spec(current);
  LOOM_CHECK(spec.mesh->ranks() == mesh.ranks() && spec.placements == Placements{placement},
             "parallelize_module: {} on '{}': parameter '{}' is already a DTensor {} (shared with "
             "a module parallelized earlier?); this style needs {} on {}",
             style, fqn, name, spec.str(), placements_str({placement}), mesh.str());
}

void distribute_parameter(nn::Module& module, const std::string& fqn, const std::string& name,
                          const std::shared_ptr<const DeviceMesh>& mesh,
                          const Placement& placement) {
  if (!module.has_parameter(name)) return;  // an optional parameter it lacks (no bias)
  const Tensor& current = module.parameter(name);
  if (is_dtensor(current)) {
    // Shared with a module parallelized earlier: it must already have this layout.
    check_parameter(module, fqn, name, *mesh, placement, "distribute_parameter",
                    /*required=*/true);
    return;
  }
  Tensor distributed;
  {
    NoGradGuard no_grad;
    distributed = distribute_tensor(current, mesh, {placement});
  }
  // Its gradient will take the same layout as it accumulates (autograd's AccumulateGrad matches
  // a distributed leaf's layout: a Partial gradient of a Replicate norm weight is all-reduced).
  distributed.set_requires_grad(current.requires_grad());
  module.set_parameter(name, distributed);
}

Tensor prepare_input(const Tensor& input, const std::shared_ptr<const DeviceMesh>& mesh,
                     const Placement& layout, const Placement& desired,
                     std::optional<int64_t> global_last_dim) {
  Tensor x = input;
  if (!is_dtensor(input)) {
    const int64_t ndim = input.dim();
    Shape global = input.shape();
    if (global_last_dim.has_value() && ndim > 0) global.back() = *global_last_dim;
    if (layout.is_shard() && ndim > 0) {
      const int64_t d = layout.dim() < 0 ? layout.dim() + ndim : layout.dim();
      LOOM_CHECK(d >= 0 && d < ndim,
                 "parallelize_module: input layout {} does not fit an input of shape {}",
                 layout.str(), shape_str(input.shape()));
      // Any sharded dim other than a fixed last one is taken to be split evenly, as from_local
      // does.
      if (!(global_last_dim.has_value() && d == ndim - 1)) global[d] *= mesh->size(0);
    }
    x = from_local(input, mesh, {layout}, global);
  }
  return dtensor_spec(x).placements == Placements{desired} ? x : redistribute(x, {desired});
}

Tensor prepare_output(const Tensor& output, const std::shared_ptr<const DeviceMesh>& mesh,
                      const Placement& layout, const Placement& desired, bool use_local_output) {
  const Tensor y = prepare_input(output, mesh, layout, desired);
  return use_local_output ? to_local(y) : y;
}

}  // namespace loom::tp
