// The pieces every tensor-parallel style is made of: distributing a module's parameters, and
// converting a module's input or output between plain local tensors and DTensors of a layout.
// Reachable from //parallel/tp for users writing their own ParallelStyle (style.h); the names
// stay in tp::detail until they are made stable public API.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "dtensor/placement.h"
#include "mesh/device_mesh.h"
#include "nn/module.h"

namespace loom::tp::detail {

// "parallelize_module: ColwiseParallel needs a 1-D mesh (e.g. mesh["tp"]), got ..." otherwise.
void check_one_dim(const DeviceMesh& mesh, const std::string& style);

// Replaces parameter `name` of `module` (if the module has it defined) by a DTensor with
// `placement`, distributed from the mesh's first rank, keeping requires_grad. A parameter that
// already is a DTensor (shared with a module parallelized earlier) must already have that
// layout: "... 'wte.weight' is already a DTensor ...; this style needs ...".
void distribute_parameter(nn::Module& module, const std::string& fqn, const std::string& name,
                          const std::shared_ptr<const DeviceMesh>& mesh,
                          const Placement& placement);

// A module's input: a plain tensor is taken to be laid out as `layout` (its global shape is its
// local shape, a sharded dim scaled by the mesh size as from_local does, unless `global_last_dim`
// gives the last dim's global size — Linear's in_features, which keeps uneven shards right); a
// DTensor keeps its placements. Then it is redistributed to `desired`.
Tensor prepare_input(const Tensor& input, const std::shared_ptr<const DeviceMesh>& mesh,
                     const Placement& layout, const Placement& desired,
                     std::optional<int64_t> global_last_dim = std::nullopt);

// A module's output: as prepare_input, then a local tensor when `use_local_output`.
Tensor prepare_output(const Tensor& output, const std::shared_ptr<const DeviceMesh>& mesh,
                      const Placement& layout, const Placement& desired, bool use_local_output);

}  // namespace loom::tp::detail
