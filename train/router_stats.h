// A mixture of experts across the job's mesh: the router statistics a step reports (metrics line
// and JSONL) and the expert-bias step of auxiliary-loss-free balancing, both over every rank that
// holds a copy of a MoE layer (the data-parallel ranks: dp_replicate x dp_shard x cp).
#pragma once

#include <cstdint>
#include <vector>

#include "mesh/device_mesh.h"
#include "nn/moe/moe.h"
#include "train/parallel_model.h"

namespace loom::train {

// What the routers did since the last call, over the global batch: the busiest and idlest
// expert's slots over the mean (the worst layer's), the auxiliary loss (summed over layers,
// averaged over data-parallel ranks as the loss is), and slots dropped by capacity (all layers,
// all ranks). Collective over the data-parallel groups (the loads, one all-reduce each) and then
// the mesh's world group (two all-reduces; along every mesh dim where the mesh is a part of its
// world): every rank calls it, MoE layers or not.
struct RouterSummary {
  int64_t layers = 0;  // MoE layers in the model
  double max_over_mean = 0;
  double min_over_mean = 0;
  double aux_loss = 0;
  int64_t dropped = 0;
};
RouterSummary take_router_summary(const ParallelModel& model, const DeviceMesh& mesh);

// After the optimizer step: each layer's load since its last update summed over the
// data-parallel ranks, then its bias moved (nn::MoE::update_expert_bias), so every copy moves
// alike. Collective over the data-parallel groups, for layers with a bias update rate only.
void update_expert_biases(const ParallelModel& model, const DeviceMesh& mesh);

// Replicas (TrainerOptions::replicas) exchange only their gradients, so the loads that move the
// bias cross between them with the gradients: each layer's load since its last update as an f32
// tensor on `device` (layers whose bias moves, in model order), averaged over the members with
// the gradients, then set back as the members' sum (the mean times `members`, exact for counts
// below 2^22). Local: no collective.
std::vector<Tensor> expert_loads(const ParallelModel& model, Device device);
void set_replica_summed_loads(const ParallelModel& model, const std::vector<Tensor>& averaged,
                              int members);

}  // namespace loom::train
