#include "parallel/build_stage.h"

#include "autograd/grad_mode.h"
#include "nn/meta_init.h"
#include "nn/moe/moe.h"
#include "parallel/ep/expert_parallel.h"

namespace loom::parallel {

BuiltStage build_stage(const StageFactory& factory, const ParallelMeshes& meshes,
                       const StageLayout& layout) {
  const Device device = meshes.mesh->device();
  BuiltStage out;
  const auto lay_out = [&](nn::Module& module) {
    layout.activation_checkpoint.apply(factory.blocks(module), layout.first_block);
    if (meshes.tp->size(0) > 1) factory.parallelize(module, meshes.tp);
    if (meshes.ep) {  // every MoE's experts over ep, before data parallelism takes the rest
      for (const auto& [name, sub] : module.named_modules()) {
        if (auto* moe = dynamic_cast<nn::MoE*>(sub)) ep::expert_parallel(*moe, meshes.ep);
      }
    }
  };
  if (layout.meta_init) {
    // The TP plan's shards are placeholders too: nothing of the layout is this rank's memory
    // until materialize() gives it bytes.
    nn::MetaBuildScope meta;
    out.module = factory.make();
    lay_out(*out.module);
  } else {
    out.module = factory.make();
    out.module->to(device);  // before the TP plan and data parallelism take the parameters
    lay_out(*out.module);
  }
  nn::Module& module = *out.module;
  out.data_parallel = std::make_shared<DataParallel>(
      out.module, factory.blocks(module), meshes, layout.mixed_precision,
      layout.meta_init ? std::function<void()>([&module, device] {
        // This rank's shards get bytes (on a traced meta device: they now count as its memory)
        // and their values.
        nn::materialize(module, device);
        NoGradGuard no_grad;
        module.init_weights();
      })
                       : std::function<void()>());
  return out;
}

}  // namespace loom::parallel
