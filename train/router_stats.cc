#include "train/router_stats.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tensor/ops.h"
#include "train/parallel_dims.h"

namespace loom::train {

namespace {

constexpr double kDroppedSplit = 4096;

// Each layer's per-expert counts, summed over the data-parallel ranks (one all-reduce per group
// for all layers together).
std::vector<std::vector<int64_t>> summed_over_data_parallel(
    const std::vector<std::vector<int64_t>>& counts, const DeviceMesh& mesh) {
  std::vector<int64_t> flat;
  for (const auto& layer : counts) flat.insert(flat.end(), layer.begin(), layer.end());
  const std::vector<int64_t> summed = sum_over_data_parallel(flat, mesh);
  std::vector<std::vector<int64_t>> out;
  auto at = summed.begin();
  for (const auto& layer : counts) {
    out.emplace_back(at, at + static_cast<std::ptrdiff_t>(layer.size()));
    at += static_cast<std::ptrdiff_t>(layer.size());
  }
  return out;
}

// The MoE layers whose bias moves (a bias update rate above 0), in model order.
std::vector<nn::MoE*> layers_moving_bias(const ParallelModel& model) {
  std::vector<nn::MoE*> out;
  for (nn::MoE* moe : moe_layers(model)) {
    if (moe->options().bias_update_rate > 0) out.push_back(moe);
  }
  return out;
}

}  // namespace

RouterSummary take_router_summary(const ParallelModel& model, const DeviceMesh& mesh) {
  std::vector<std::vector<int64_t>> loads;
  double aux = 0, dropped = 0;
  for (nn::MoE* moe : moe_layers(model)) {
    const nn::RouterStats stats = moe->take_stats();
    loads.push_back(stats.tokens_per_expert);
    aux += stats.aux_loss;
    dropped += static_cast<double>(stats.dropped);
  }
  loads = summed_over_data_parallel(loads, mesh);
  double worst_max = 0, worst_min = std::numeric_limits<double>::infinity();
  for (const auto& load : loads) {
    const nn::RouterStats layer{.tokens_per_expert = load};
    worst_max = std::max(worst_max, layer.max_over_mean());
    worst_min = std::min(worst_min, layer.min_over_mean());
  }
  // Over every rank: [max ratio, -min ratio] by max; [aux, dropped (two parts), layers] by sum.
  Tensor maxima = ops::to(
      ops::from_vector({static_cast<float>(worst_max), static_cast<float>(-worst_min)}, {2}),
      mesh.device());
  // Dropped slots as two f32 parts, each summed exactly (lo < 4096 a rank; hi exact below 2^24
  // in all), so counts past f32's 2^24 are not rounded: up to 2^36.
  const double hi = std::floor(dropped / kDroppedSplit), lo = dropped - hi * kDroppedSplit;
  Tensor sums = ops::to(ops::from_vector({static_cast<float>(aux), static_cast<float>(hi),
                                          static_cast<float>(lo), static_cast<float>(loads.size())},
                                         {4}),
                        mesh.device());
  // Over the mesh's world group when the mesh spans it (two calls, where one per mesh dim made 2
  // x ndim), else along every dim of the mesh.
  std::vector<std::shared_ptr<comm::ProcessGroup>> groups{mesh.world()};
  if (mesh.world()->size() != mesh.numel()) {
    groups.clear();
    for (int64_t d = 0; d < mesh.ndim(); ++d) groups.push_back(mesh.group(d));
  }
  for (const auto& group : groups) {
    group->all_reduce(maxima, comm::ReduceOp::kMax)->wait();
    group->all_reduce(sums, comm::ReduceOp::kSum)->wait();
  }
  const std::vector<double> m = ops::to_vector(maxima), s = ops::to_vector(sums);
  // Each layer was counted once per rank holding it: every rank of its pipeline stage. Drops,
  // once per tp rank (tp ranks route the same tokens).
  const auto& names = mesh.dim_names();
  const auto size_of = [&](const char* dim) {
    return std::find(names.begin(), names.end(), dim) != names.end() ? mesh.size(dim) : 1;
  };
  const int64_t copies = mesh.numel() / size_of(kPipelineDim);
  RouterSummary summary;
  summary.layers = std::llround(s[3]) / copies;
  if (summary.layers == 0) return summary;
  summary.max_over_mean = m[0];
  summary.min_over_mean = -m[1];
  summary.aux_loss = s[0] / static_cast<double>(copies);
  summary.dropped =
      (std::llround(s[1]) * static_cast<int64_t>(kDroppedSplit) + std::llround(s[2])) /
      size_of(kTensorDim);
  return summary;
}

void update_expert_biases(const ParallelModel& model, const DeviceMesh& mesh) {
  const std::vector<nn::MoE*> moving = layers_moving_bias(model);
  if (moving.empty()) return;
  std::vector<std::vector<int64_t>> loads;
  for (nn::MoE* moe : moving) loads.push_back(moe->load_since_update());
  loads = summed_over_data_parallel(loads, mesh);
  for (size_t i = 0; i < moving.size(); ++i) {
    moving[i]->set_load_since_update(loads[i]);
    moving[i]->update_expert_bias();
  }
}

std::vector<Tensor> expert_loads(const ParallelModel& model, Device device) {
  std::vector<Tensor> out;
  for (nn::MoE* moe : layers_moving_bias(model)) {
    const std::vector<int64_t>& load = moe->load_since_update();
    std::vector<float> values(load.begin(), load.end());
    out.push_back(ops::to(ops::from_vector(values, {static_cast<int64_t>(values.size())}), device));
  }
  return out;
}

void set_replica_summed_loads(const ParallelModel& model, const std::vector<Tensor>& averaged,
                              int members) {
  size_t i = 0;
  for (nn::MoE* moe : layers_moving_bias(model)) {
    const std::vector<double> mean = ops::to_vector(averaged.at(i++));
    std::vector<int64_t> sum(mean.size());
    for (size_t e = 0; e < mean.size(); ++e) sum[e] = std::llround(mean[e] * members);
    moe->set_load_since_update(std::move(sum));
  }
}

}  // namespace loom::train
