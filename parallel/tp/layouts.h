// Writing your own ParallelStyle (style.h), as torch users subclass ParallelStyle: the pieces
// every built-in style is made of, public so that a user's style reuses them instead of
// reimplementing them. A style is two methods:
//   validate(module, fqn, mesh)  checks that it fits, changing nothing (parallelize_module calls
//                                it for every entry of a plan before applying any);
//   apply(module, fqn, mesh)     distributes the module's parameters (distribute_parameter) and
//                                installs forward hooks that lay out its input and output
//                                (prepare_input / prepare_output).
// examples/gated_mlp_plan.cc writes one (GatedFeedForwardParallel: a gated MLP's three projections)
// with these.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "dtensor/placement.h"
#include "mesh/device_mesh.h"
#include "nn/module.h"

namespace loom::tp {

// "parallelize_module: ColwiseParallel needs a 1-D mesh (e.g. mesh["tp"]), got ..." otherwise.
void check_one_dim(const DeviceMesh& mesh, const std::string& style);

// For validate(): throws naming the module, the style and the parameter when `module` lacks a
// `required` parameter `name`, or holds it as a DTensor of another layout (shared with a module
// parallelized earlier). An optional parameter the module lacks (a Linear without bias) is fine.
void check_parameter(const nn::Module& module, const std::string& fqn, const std::string& name,
                     const DeviceMesh& mesh, const Placement& placement, const std::string& style,
                     bool required);

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

// The names these had before they were public.
namespace detail {
using tp::check_one_dim;
using tp::distribute_parameter;
using tp::prepare_input;
using tp::prepare_output;
}  // namespace detail

}  // namespace loom::tp
