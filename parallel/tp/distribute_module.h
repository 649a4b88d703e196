// distribute_module (torch.distributed.tensor.distribute_module): lay out a module's parameters
// on a mesh by a function of one's own, and convert its input and output with functions of one's
// own — the general form of parallelize_module, for layouts no ParallelStyle describes.
//
//   tp::distribute_module(model, mesh,
//       [](const std::string& name, nn::Module& m, const std::shared_ptr<const DeviceMesh>& mesh) {
//         if (name == "fc1") tp::distribute_parameter(m, name, "weight", mesh, Shard(0));
//       },
//       /*input_fn=*/[](nn::Module&, const Tensor& x, const std::shared_ptr<const DeviceMesh>&
//       mesh) {
//         return distribute_tensor(x, mesh, {Replicate()});
//       });
//
// partition_fn(name, submodule, mesh) runs for the module itself ("") and every submodule, depth
// first (named_modules' order); afterwards every parameter of that submodule that is not yet a
// DTensor is replicated over the whole mesh (distributed from its first rank, requires_grad
// kept), as torch does — with no partition_fn, every parameter is replicated. input_fn(module,
// input, mesh) and output_fn(module, output, mesh) become the module's forward pre-hook and
// forward hook. Buffers are left as they are. Collective: every rank of the mesh calls it alike
// (the replication broadcasts).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "mesh/device_mesh.h"
#include "nn/module.h"

namespace loom::tp {

using PartitionFn = std::function<void(const std::string& name, nn::Module& module,
                                       const std::shared_ptr<const DeviceMesh>& mesh)>;
using ModuleInputFn = std::function<Tensor(nn::Module& module, const Tensor& input,
                                           const std::shared_ptr<const DeviceMesh>& mesh)>;
using ModuleOutputFn = std::function<Tensor(nn::Module& module, const Tensor& output,
                                            const std::shared_ptr<const DeviceMesh>& mesh)>;

void distribute_module(nn::Module& module, std::shared_ptr<const DeviceMesh> mesh,
                       const PartitionFn& partition_fn = nullptr,
                       const ModuleInputFn& input_fn = nullptr,
                       const ModuleOutputFn& output_fn = nullptr);

}  // namespace loom::tp
