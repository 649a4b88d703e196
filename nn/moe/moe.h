// A mixture-of-experts feed-forward (torchtitan's MoE, DeepSeek-V3's DeepseekV3MoE): a router
// picks top_k of num_experts SwiGLU experts per token, the tokens are sorted by expert and every
// expert's rows run in one grouped GEMM per projection, and each token's output is the weighted
// sum of its experts' (plus the shared experts', when there are any).
//
//   nn::MoE moe(/*dim=*/64, {.num_experts = 8, .top_k = 2, .hidden_dim = 32}, /*seed=*/1);
//   Tensor y = moe(x);                     // (..., 64) -> (..., 64)
//   nn::RouterStats s = moe.take_stats();  // per-expert load, auxiliary loss, dropped slots
//
// Routing (routing.h) runs on the host from the scores: one device-to-host copy of (tokens,
// experts) scores per call. The top-k weights are the scores at the chosen experts (normalized
// to sum 1 with route_norm, times route_scale); gradients reach the router through them, and
// through the auxiliary loss. The auxiliary loss enters training through the gradient: the
// output carries it (nn/auxiliary_loss.h), so a pipeline stage or a layer deep in the model adds
// it to the loss it trains without returning it.
//
// On the meta device (a traced step, `loom plan`) scores have no values: routing assumes the
// uniform one, token t's choice k going to expert (t * top_k + k) mod num_experts.
//
// Names: gate.weight (experts, dim); experts.w1 and experts.w3 (experts, hidden, dim),
// experts.w2 (experts, dim, hidden); shared_experts.{w1,w2,w3}.weight; the buffer expert_bias
// (experts), f32.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "nn/linear.h"
#include "nn/module.h"
#include "nn/moe/moe_options.h"
#include "nn/moe/routing.h"

namespace loom::nn {

// Every expert's SwiGLU weights in three (experts, ·, ·) tensors. Called as a module (so the
// hooks of whoever lays its weights out run: FSDP's gathers), on rows sorted by expert whose
// offsets the caller sets first.
class GroupedExperts : public Module {
 public:
  GroupedExperts(int64_t dim, int64_t hidden_dim, int64_t num_experts, uint64_t seed);
  // Expert e's rows of the next call: [offsets[e], offsets[e + 1]) (its experts' count + 1).
  void set_group_offsets(std::vector<int64_t> offsets) { offsets_ = std::move(offsets); }
  // x: (N, dim), rows sorted by expert -> (N, dim): w2_e(silu(w1_e x) * w3_e x) per row, in x's
  // dtype.
  Tensor forward(const Tensor& x) override;
  // How forward reads a weight (identity by default; expert parallelism's local shard of a
  // DTensor weight).
  void set_weight_view(std::function<Tensor(const Tensor&)> view) { view_ = std::move(view); }
  // Tensor parallelism of the experts (each tp rank a slice of every expert's hidden width): the
  // input through `in` (its gradient summed over tp), the partial outputs through `out` (summed
  // over tp). Identity when unset.
  void set_tensor_parallel_regions(std::function<Tensor(const Tensor&)> in,
                                   std::function<Tensor(const Tensor&)> out) {
    in_region_ = std::move(in);
    out_region_ = std::move(out);
  }
  void reset_parameters() override;
  const Tensor& w1() const { return w1_; }
  const Tensor& w2() const { return w2_; }
  const Tensor& w3() const { return w3_; }

 private:
  uint64_t seed_;
  Tensor &w1_, &w2_, &w3_;
  std::vector<int64_t> offsets_;
  std::function<Tensor(const Tensor&)> view_, in_region_, out_region_;
};

// A dense SwiGLU feed-forward (the shared experts): w2(silu(w1 x) * w3 x).
class SwiGLU : public Module {
 public:
  SwiGLU(int64_t dim, int64_t hidden_dim, uint64_t seed);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Linear> w1, w2, w3;
};

// How the tokens sorted by expert reach their experts and come back: locally by default, or
// over ranks (expert parallelism, parallel/ep). `sorted`: (N, dim), this rank's kept slots in
// expert order, expert e's rows [offsets[e], offsets[e + 1]) of all num_experts. Returns the
// experts' outputs in the same rows.
class ExpertDispatch {
 public:
  virtual ~ExpertDispatch() = default;
  virtual Tensor run(GroupedExperts& experts, const Tensor& sorted,
                     const std::vector<int64_t>& offsets) = 0;
};

// What the router did since the last take_stats(): slots routed per expert (before capacity),
// the auxiliary loss (summed over calls), slots dropped by capacity, and calls.
struct RouterStats {
  std::vector<int64_t> tokens_per_expert;
  // This rank's term of the auxiliary loss. Under set_data_parallel it is the rank's share of
  // the whole batch's loss scaled so that the ranks' mean is that loss (the Trainer's metrics
  // report the mean: train/router_stats.h), not the loss itself.
  double aux_loss = 0;
  int64_t dropped = 0;
  int64_t calls = 0;
  double max_over_mean() const;  // the busiest expert's load over the mean (1: balanced)
  double min_over_mean() const;  // the idlest expert's
};

// The ranks a MoE's batch is split over (data parallelism, context parallelism: every rank
// that averages gradients with this one), for the auxiliary loss over the whole batch: `sum`
// adds a vector over those ranks (a collective), `size` is their number. Without one, the loss
// is over this rank's tokens alone.
struct MoEDataParallel {
  std::function<std::vector<double>(const std::vector<double>&)> sum;
  int64_t size = 1;
};

class MoE : public Module {
 public:
  MoE(int64_t dim, MoEOptions options, uint64_t seed);
  Tensor forward(const Tensor& x) override;  // (..., dim) -> (..., dim)
  void reset_parameters() override;          // expert_bias back to zeros

  const MoEOptions& options() const { return options_; }
  const Tensor& expert_bias() const { return expert_bias_; }
  // The stats since the last call, then starts afresh.
  RouterStats take_stats();
  // DeepSeek-V3's auxiliary-loss-free step: bias += bias_update_rate * sign(mean load - load)
  // over the slots routed since the last update; then the count starts afresh. Call after the
  // optimizer step (a no-op when bias_update_rate is 0). Data-parallel ranks must add their
  // loads first (load_since_update / set_load_since_update) to move one bias alike.
  void update_expert_bias();
  const std::vector<int64_t>& load_since_update() const { return load_since_update_; }
  void set_load_since_update(std::vector<int64_t> load);
  // The auxiliary loss over the batch of every data-parallel rank (coeff * E * sum_e f_e P_e with
  // f and P over all of their tokens, each rank's term scaled so the gradients' mean over the
  // ranks is that loss's): one all-reduce of E + 1 numbers per call.
  void set_data_parallel(MoEDataParallel data_parallel);
  // Where the experts run (null: here, every expert on this rank).
  void set_expert_dispatch(std::shared_ptr<ExpertDispatch> dispatch) {
    dispatch_ = std::move(dispatch);
  }

  std::shared_ptr<Linear> gate;
  std::shared_ptr<GroupedExperts> experts;
  std::shared_ptr<SwiGLU> shared_experts;  // null without shared experts

 private:
  Routing route(const Tensor& scores) const;

  MoEOptions options_;
  MoEDataParallel data_parallel_;
  std::shared_ptr<ExpertDispatch> dispatch_;
  Tensor& expert_bias_;
  RouterStats stats_;
  std::vector<int64_t> load_since_update_;
};

}  // namespace loom::nn
