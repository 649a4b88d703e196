// SequenceParallel, PrepareModuleInput and PrepareModuleOutput: styles that lay out a module's
// activations (and replicate its parameters) without sharding its computation's weights.
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/hooks.h"
#include "base/error.h"
#include "dtensor/dtensor.h"
#include "parallel/tp/layouts.h"
#include "parallel/tp/style.h"
#include "tensor/ops.h"

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

namespace {

// One call's gathered input, released after forward and gathered again before backward.
struct GatheredInput {
  Tensor shard;     // the input as it came (a DTensor): kept, 1/tp of the gathered bytes
  Tensor gathered;  // its local tensor, whose storage is released between forward and backward
  Placements desired;

  // Gathers again into the released storage (the collective's fresh result moves in), then lets
  // go of both, so the gathered memory goes with the last backward node that reads it.
  void regather() {
    if (!shard.defined()) return;
    NoGradGuard no_grad;
    const Tensor again = to_local(redistribute(shard, desired));
    Storage& memory = *gathered.storage();
    const auto whole_and_contiguous = [](const Tensor& t) {
      return t.is_contiguous() && t.offset() == 0;
    };
    if (whole_and_contiguous(again) && whole_and_contiguous(gathered) &&
        again.shape() == gathered.shape() && again.storage()->bytes() == memory.bytes()) {
      memory.adopt(*again.storage());
    } else {
      memory.refill();
      ops::copy_(gathered, again);
    }
    shard = Tensor();
    gathered = Tensor();
  }
};

}  // namespace

void PrepareModuleInput::apply(nn::Module& module, const std::string& fqn,
                               std::shared_ptr<const DeviceMesh> mesh) const {
  validate(module, fqn, *mesh);
  // The calls whose gathered input awaits the forward's end (innermost last).
  auto calls = std::make_shared<std::vector<std::shared_ptr<GatheredInput>>>();
  module.register_forward_pre_hook([mesh, o = options_, calls](nn::Module&, const Tensor& input) {
    if (!o.regather_in_backward) {
      const Tensor x = detail::prepare_input(input, mesh, o.input_layouts, o.desired_input_layouts);
      return o.use_local_output ? to_local(x) : x;
    }
    const Tensor shard = detail::prepare_input(input, mesh, o.input_layouts, o.input_layouts);
    const Tensor x = detail::prepare_input(shard, mesh, o.input_layouts, o.desired_input_layouts);
    auto call = std::make_shared<GatheredInput>();
    const bool gathered = is_dtensor(x) && to_local(x).storage() != to_local(shard).storage();
    if (gathered && x.requires_grad() && !autograd::backward_running()) {
      *call = {shard, to_local(x), dtensor_spec(x).placements};
    }
    calls->push_back(call);
    return o.use_local_output ? to_local(x) : x;
  });
  if (!options_.regather_in_backward) return;
  module.register_forward_hook([calls](nn::Module&, const Tensor&, const Tensor& output) {
    if (calls->empty()) return Tensor();
    std::shared_ptr<GatheredInput> call = std::move(calls->back());
    calls->pop_back();
    if (!call->shard.defined() || !output.defined() || !output.requires_grad()) return Tensor();
    call->gathered.storage()->release();
    autograd::register_hook(output, [call](const Tensor&) {
      call->regather();
      return Tensor();
    });
    return Tensor();
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
