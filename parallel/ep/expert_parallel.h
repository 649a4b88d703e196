// Expert parallelism (torchtitan's ExpertParallel, Megatron's EP): a MoE's experts split over
// the ranks of a 1-D `ep` mesh, rank r holding experts [r E/ep, (r+1) E/ep) as DTensors
// (Shard(0) of experts.w1, w2, w3); every rank routes its own tokens, sends each slot to the
// rank of its expert and gets the expert's output back, by all-to-all:
//
//   parallel::ep::expert_parallel(moe, ep_mesh);   // after the MoE is built with all E experts
//
// Per call (ep > 1), on the ep group:
//   forward:  1 all-to-all of per-expert slot counts (E/ep int64 to each rank: the uneven sizes
//             first), 1 all-to-all of token rows to the experts' ranks (dispatch) and 1 back
//             (combine), each B_rows x dim in the activations' dtype, uneven;
//   backward: the 2 row exchanges again, the other way (the all-to-all is differentiable).
// Each rank's expert weights get the gradient of every rank's tokens routed to them (the sum
// over the ep group, as one rank's over the whole batch); the router's and every other
// parameter's gradients stay this rank's own, as data parallelism's are.
#pragma once

#include <memory>

#include "mesh/device_mesh.h"
#include "nn/moe/moe.h"
#include "parallel/tp/style.h"

namespace loom::parallel::ep {

// Throws naming both numbers when ep does not divide the MoE's experts, and the mesh when it is
// not 1-D.
void expert_parallel(nn::MoE& moe, std::shared_ptr<const DeviceMesh> ep_mesh);

// The same as a style of a plan (torchtitan's ExpertParallel), for parallelize_module on an
// nn::MoE over the 1-D ep mesh:
//   tp::parallelize_module(model, ep_mesh, {{"layers.1.moe",
//   std::make_shared<ep::ExpertParallel>()}});
// validate() refuses, changing nothing, a module that is no MoE, a mesh that is not 1-D, an ep
// that does not divide the experts, and experts already split.
class ExpertParallel : public tp::ParallelStyle {
 public:
  void validate(const nn::Module& module, const std::string& fqn,
                const DeviceMesh& mesh) const override;
  void apply(nn::Module& module, const std::string& fqn,
             std::shared_ptr<const DeviceMesh> mesh) const override;
  std::string name() const override { return "ExpertParallel"; }
};

}  // namespace loom::parallel::ep
