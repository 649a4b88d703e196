// parallelize_module: apply tensor-parallel styles to the submodules a plan names.
//
//   tp::parallelize_module(mlp, mesh, {{"fc1", std::make_shared<tp::ColwiseParallel>()},
//                                      {"fc2", std::make_shared<tp::RowwiseParallel>()}});
//
// Plan keys are fully-qualified module names with fnmatch-style wildcards ("h.*.attn.c_attn";
// '*' matches any characters, dots included, as in PyTorch). The whole plan is validated before
// anything changes: a key that matches no module is an error naming it, and so is a style that
// does not fit a module it matches (ParallelStyle::validate), and so is a module two keys match
// with styles that both change its parameters (ParallelStyle::changes_parameters); each leaves
// the model as it was. A style's apply that throws after its
// validate passed may leave the plan half applied: validate what apply needs.
// A style for the module itself (PyTorch's parallelize_module(linear, mesh, ColwiseParallel())):
//   tp::parallelize_module(linear, mesh, std::make_shared<tp::ColwiseParallel>());
// Collective: every rank of the mesh calls it with the same plan (parameters are distributed
// from rank 0's values).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mesh/device_mesh.h"
#include "nn/module.h"
#include "parallel/tp/style.h"

namespace loom::tp {

using ParallelizePlan = std::vector<std::pair<std::string, std::shared_ptr<ParallelStyle>>>;

void parallelize_module(nn::Module& module, std::shared_ptr<const DeviceMesh> mesh,
                        const ParallelizePlan& plan);
// The same on a mesh value (a slice: mesh["tp"]), or on one named dim of a larger mesh:
//   tp::parallelize_module(model, *mesh, "tp", plan);
void parallelize_module(nn::Module& module, const DeviceMesh& mesh, const ParallelizePlan& plan);
// One style applied to `module` itself (validated first).
void parallelize_module(nn::Module& module, std::shared_ptr<const DeviceMesh> mesh,
                        const std::shared_ptr<ParallelStyle>& style);
void parallelize_module(nn::Module& module, const DeviceMesh& mesh,
                        const std::shared_ptr<ParallelStyle>& style);
void parallelize_module(nn::Module& module, const DeviceMesh& mesh, const std::string& dim,
                        const ParallelizePlan& plan);

// fnmatch-style matching of a module name against a plan key.
bool fqn_matches(const std::string& pattern, const std::string& fqn);

}  // namespace loom::tp
