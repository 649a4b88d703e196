#include "parallel/tp/distribute_module.h"

#include <map>

#include "base/error.h"
#include "dtensor/dtensor.h"
#include "tensor/grad_mode.h"

namespace loom::tp {

namespace {

// Every direct parameter of `module` that is not a DTensor yet, replicated over `mesh`; one that
// another module shares (a tied embedding and head) gets the same DTensor (`done`, by the
// original tensor), so the tie holds.
void replicate_parameters(nn::Module& module, const std::shared_ptr<const DeviceMesh>& mesh,
                          std::map<const TensorImpl*, Tensor>& done) {
  for (const auto& [name, parameter] : module.named_parameters(/*recurse=*/false)) {
    if (is_dtensor(parameter)) continue;
    auto [it, fresh] = done.try_emplace(parameter.impl());
    if (fresh) {
      {
        NoGradGuard no_grad;
        it->second = distribute_tensor(parameter, mesh,
                                       Placements(static_cast<size_t>(mesh->ndim()), Replicate()));
      }
      it->second.set_requires_grad(parameter.requires_grad());
    }
    module.set_parameter(name, it->second);
  }
}

}  // namespace

void distribute_module(nn::Module& module, std::shared_ptr<const DeviceMesh> mesh,
                       const PartitionFn& partition_fn, const ModuleInputFn& input_fn,
                       const ModuleOutputFn& output_fn) {
  LOOM_CHECK(mesh != nullptr, "distribute_module: the mesh is null");
  std::map<const TensorImpl*, Tensor> replicated;
  for (const auto& [name, submodule] : module.named_modules()) {
    if (partition_fn) partition_fn(name, *submodule, mesh);
    replicate_parameters(*submodule, mesh, replicated);
  }
  if (input_fn) {
    module.register_forward_pre_hook(
        [input_fn, mesh](nn::Module& m, const Tensor& input) { return input_fn(m, input, mesh); });
  }
  if (output_fn) {
    module.register_forward_hook(
        [output_fn, mesh](nn::Module& m, const Tensor&, const Tensor& output) {
          return output_fn(m, output, mesh);
        });
  }
}

}  // namespace loom::tp
