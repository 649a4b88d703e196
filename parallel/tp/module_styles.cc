// SequenceParallel, PrepareModuleInput and PrepareModuleOutput: styles that lay out a module's
// activations (and replicate its parameters) without sharding its computation's weights.
#include "base/error.h"
#include "dtensor/dtensor.h"
#include "parallel/tp/layouts.h"
#include "parallel/tp/style.h"

namespace loom::tp {

void SequenceParallel::validate(const nn::Module& module, const std::string& fqn,
                                const DeviceMesh& mesh) const {
  check_one_dim(mesh, name());
  LOOM_CHECK(module.named_children().empty(),
             "parallelize_module: SequenceParallel applies to leaf modules (norms, dropout), but "
             "'{}' ({}) has submodules",
             fqn, module.type_name());
  for (const auto& [param, value] : module.named_parameters(/*recurse=*/false)) {
    check_parameter(module, fqn, param, mesh, Replicate(), name(), /*required=*/true);
  }
}

void SequenceParallel::apply(nn::Module& module, const std::string& fqn,
                             std::shared_ptr<const DeviceMesh> mesh) const {
  validate(module, fqn, *mesh);
  for (const auto& [param, value] : module.named_parameters(/*recurse=*/false)) {
    detail::distribute_parameter(module, fqn, param, mesh, Replicate());
  }
  const Placement sequence = Shard(options_.sequence_dim);
  module.register_forward_pre_hook([mesh, sequence](nn::Module&, const Tensor& input) {
    return detail::prepare_input(input, mesh, sequence, sequence);
  });
  module.register_forward_hook([mesh, sequence, local = options_.use_local_output](
                                   nn::Module&, const Tensor&, const Tensor& output) {
    return detail::prepare_output(output, mesh, sequence, sequence, local);
  });
}

void PrepareModuleInput::validate(const nn::Module&, const std::string&,
                                  const DeviceMesh& mesh) const {
  check_one_dim(mesh, name());
}

void PrepareModuleInput::apply(nn::Module& module, const std::string& fqn,
                               std::shared_ptr<const DeviceMesh> mesh) const {
  validate(module, fqn, *mesh);
  module.register_forward_pre_hook([mesh, o = options_](nn::Module&, const Tensor& input) {
    const Tensor x = detail::prepare_input(input, mesh, o.input_layouts, o.desired_input_layouts);
    return o.use_local_output ? to_local(x) : x;
  });
}

void PrepareModuleOutput::validate(const nn::Module&, const std::string&,
                                   const DeviceMesh& mesh) const {
  check_one_dim(mesh, name());
}

void PrepareModuleOutput::apply(nn::Module& module, const std::string& fqn,
                                std::shared_ptr<const DeviceMesh> mesh) const {
  validate(module, fqn, *mesh);
  module.register_forward_hook(
      [mesh, o = options_](nn::Module&, const Tensor&, const Tensor& output) {
        return detail::prepare_output(output, mesh, o.output_layouts, o.desired_output_layouts,
                                      o.use_local_output);
      });
}

}  // namespace loom::tp
