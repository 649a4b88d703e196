#include "nn/moe/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "autograd/function.h"
#include "autograd/gather_rows.h"
#include "autograd/grouped_mm.h"
#include "base/error.h"
#include "nn/auxiliary_loss.h"
#include "nn/checkpoint.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::nn {

GroupedExperts::GroupedExperts(int64_t dim, int64_t hidden_dim, int64_t num_experts, uint64_t seed)
    : Module("GroupedExperts"),
      seed_(seed),
      w1_(register_parameter("w1", ops::empty({num_experts, hidden_dim, dim}))),
      w2_(register_parameter("w2", ops::empty({num_experts, dim, hidden_dim}))),
      w3_(register_parameter("w3", ops::empty({num_experts, hidden_dim, dim}))) {
  reset_parameters();
}

void GroupedExperts::reset_parameters() {
  // As each expert's Linear would be (nn::Linear: U(-1/sqrt(in), 1/sqrt(in))).
  const auto init = [](const Tensor& w, uint64_t seed) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(w.size(2)));
    ops::uniform_(w, seed, -bound, bound);
  };
  init(w1_, seed_);
  init(w2_, seed_ + 1);
  init(w3_, seed_ + 2);
}

Tensor GroupedExperts::forward(const Tensor& x) {
  LOOM_CHECK(!offsets_.empty(),
             "GroupedExperts: no group offsets for this call; set_group_offsets() first");
  // In the activations' dtype: mixed precision's bf16 compute over f32 masters reaches weights
  // that no FSDP unit casts, as it reaches the others.
  const auto weight = [&](const Tensor& w) {
    const Tensor seen = view_ ? view_(w) : w;
    return seen.dtype() == x.dtype() ? seen : ops::to(seen, x.dtype());
  };
  const std::vector<int64_t> offsets = std::move(offsets_);
  offsets_.clear();
  const Tensor in = in_region_ ? in_region_(x) : x;
  const Tensor h =
      ops::silu_mul(grouped_mm(in, weight(w1_), offsets), grouped_mm(in, weight(w3_), offsets));
  const Tensor out = grouped_mm(h, weight(w2_), offsets);
  return out_region_ ? out_region_(out) : out;
}

SwiGLU::SwiGLU(int64_t dim, int64_t hidden_dim, uint64_t seed) : Module("SwiGLU") {
  const auto linear = [](int64_t in, int64_t out, uint64_t s) {
    return std::make_shared<Linear>(in, out, LinearOptions{.bias = false, .seed = s});
  };
  w1 = register_module("w1", linear(dim, hidden_dim, seed));
  w2 = register_module("w2", linear(hidden_dim, dim, seed + 1));
  w3 = register_module("w3", linear(dim, hidden_dim, seed + 2));
}

Tensor SwiGLU::forward(const Tensor& x) { return (*w2)(ops::silu_mul((*w1)(x), (*w3)(x))); }

namespace {

// The load `pick` chooses (the largest or the smallest) over the mean load; 0 without any.
template <typename Pick>
double over_mean(const std::vector<int64_t>& load, Pick pick) {
  const double total = std::accumulate(load.begin(), load.end(), 0.0);
  if (load.empty() || total == 0) return 0;
  return static_cast<double>(*pick(load.begin(), load.end())) /
         (total / static_cast<double>(load.size()));
}

}  // namespace

double RouterStats::max_over_mean() const {
  return over_mean(tokens_per_expert, [](auto a, auto b) { return std::max_element(a, b); });
}

double RouterStats::min_over_mean() const {
  return over_mean(tokens_per_expert, [](auto a, auto b) { return std::min_element(a, b); });
}

MoE::MoE(int64_t dim, MoEOptions options, uint64_t seed)
    : Module("MoE"),
      options_((options.validate(), std::move(options))),
      expert_bias_(register_buffer("expert_bias", ops::zeros({options_.num_experts}))) {
  LOOM_CHECK(dim >= 1, "MoE: dim must be >= 1, got {}", dim);
  gate =
      register_module("gate", std::make_shared<Linear>(dim, options_.num_experts,
                                                       LinearOptions{.bias = false, .seed = seed}));
  experts = register_module(
      "experts",
      std::make_shared<GroupedExperts>(dim, options_.hidden_dim, options_.num_experts, seed + 1));
  if (options_.num_shared_experts > 0) {
    shared_experts = register_module(
        "shared_experts",
        std::make_shared<SwiGLU>(dim, options_.hidden_dim * options_.num_shared_experts, seed + 4));
  }
  stats_.tokens_per_expert.assign(options_.num_experts, 0);
  load_since_update_.assign(options_.num_experts, 0);
}

void MoE::reset_parameters() { ops::fill_(expert_bias_, 0.0); }

Routing MoE::route(const Tensor& scores) const {
  const int64_t tokens = scores.size(0), e = options_.num_experts, k = options_.top_k;
  const int64_t capacity = expert_capacity(options_.capacity_factor, tokens, k, e);
  if (scores.device().is_meta()) {
    // No values: the uniform routing, token t's c-th choice expert (t * k + c) % E.
    std::vector<int64_t> uniform(tokens * k);
    std::iota(uniform.begin(), uniform.end(), int64_t{0});
    for (int64_t& expert : uniform) expert %= e;
    return place_choices(std::move(uniform), tokens, e, k, capacity);
  }
  // Chosen where the scores are (ops::top_k_indices, in route_top_k's order: f32 keys, ties to
  // the lower expert): on a GPU only the (tokens, k) choices come to the host, not the (tokens,
  // E) scores, nor a host top-k over all of them. A NaN key is named; softmax and sigmoid scores
  // and the bias's finite steps give no infinite key (one would order as a number). The bias
  // chooses whenever the model has one (moved by this run, an earlier one, or loaded: DeepSeek-V3's
  // e_score_correction_bias), not only while bias_update_rate moves it: it is part of the model.
  NoGradGuard no_grad;
  Tensor keys = ops::add(scores, expert_bias_);
  if (options_.limits_groups()) {
    // Group-limited routing masks the other groups' keys on the host: the (tokens, E) keys come
    // over once per call, and go back to choose where the scores are.
    std::vector<float> host(static_cast<size_t>(tokens * e));
    const Tensor on_cpu = ops::contiguous(ops::to(ops::to(keys, kFloat32), Device::cpu()));
    std::copy_n(on_cpu.data<float>(), host.size(), host.begin());
    limit_to_groups(host, tokens, e, options_.num_expert_groups, options_.num_limited_groups);
    keys = ops::to(ops::from_vector(host, {tokens, e}), scores.device());
  }
  const std::vector<double> picked = ops::to_vector(ops::top_k_indices(keys, k));
  std::vector<int64_t> choice(picked.size());
  for (size_t i = 0; i < picked.size(); ++i) {
    LOOM_CHECK(picked[i] >= 0,
               "MoE: token {}'s router scores hold a NaN{}; they must be finite (a diverged "
               "run?)",
               static_cast<int64_t>(i) / k,
               options_.bias_update_rate > 0 ? " (with the expert bias)" : "");
    choice[i] = static_cast<int64_t>(picked[i]);
  }
  return place_choices(std::move(choice), tokens, e, k, capacity);
}

Tensor MoE::forward(const Tensor& x) {
  LOOM_CHECK(x.extension() == nullptr,
             "MoE: the input is a wrapper tensor (a DTensor: {}); the MoE routes this rank's "
             "tokens as a plain tensor: hand it the local tensor (a PrepareModuleInput style "
             "with use_local_output, or to_local), as Loom's plans do",
             x.description());
  const int64_t dim = x.size(-1);
  const Tensor flat = ops::reshape(x, {-1, dim});
  const int64_t tokens = flat.size(0), e = options_.num_experts, k = options_.top_k;
  // Through operator(), as experts: the submodules' hooks run (FSDP's gathers, a user's).
  const Tensor logits = ops::to((*gate)(flat), kFloat32);
  const Tensor scores =
      options_.score_func == "sigmoid" ? ops::sigmoid(logits) : ops::softmax(logits, -1);
  const Routing routing = route(scores);

  // The chosen experts' scores: rows t * E + e of the scores as a column.
  std::vector<int64_t> picked(tokens * k);
  for (int64_t i = 0; i < tokens * k; ++i) picked[i] = (i / k) * e + routing.choice[i];
  // Gathers by host indices whose backward is a gather too (autograd/gather_rows.h): no
  // scatter-add, so the same on every device, bit for bit, and in the tensors' dtype.
  Tensor weights = ops::reshape(
      gather_rows(ops::reshape(scores, {tokens * e, 1}), picked, {tokens, k}), {tokens, k});
  if (options_.route_norm) weights = ops::div(weights, ops::sum(weights, {-1}, /*keepdim=*/true));
  if (options_.route_scale != 1.0) weights = ops::mul(weights, options_.route_scale);

  // Tokens in expert order, every expert's rows in one grouped GEMM per projection.
  const Tensor sorted = gather_rows(flat, routing.slot_token, {routing.kept()});
  Tensor expert_out;
  if (dispatch_) {
    expert_out = dispatch_->run(*experts, sorted, routing.offsets);
  } else {
    experts->set_group_offsets(routing.offsets);
    expert_out = (*experts)(sorted);
  }
  // Back to (token, choice) order; a dropped choice reads a zero row.
  std::vector<int64_t> slot_of = routing.slot_of;
  std::replace(slot_of.begin(), slot_of.end(), routing.kept(), int64_t{-1});
  const Tensor per_choice = gather_rows(expert_out, slot_of, {tokens, k});
  Tensor out =
      ops::sum(ops::mul(per_choice, ops::unsqueeze(ops::to(weights, per_choice.dtype()), -1)), {1});
  if (shared_experts) out = ops::add(out, (*shared_experts)(flat));

  double aux_value = 0;
  if (options_.aux_loss_coeff > 0) {
    // coeff * E * sum_e f_e P_e: f_e the share of routed slots (a constant), P_e the mean over
    // tokens of each token's scores normalized to sum 1.
    const Tensor normalized = options_.score_func == "sigmoid"
                                  ? ops::div(scores, ops::sum(scores, {-1}, /*keepdim=*/true))
                                  : scores;
    // Over the data-parallel ranks' tokens when they are set: their counts summed.
    std::vector<double> counts(routing.routed.begin(), routing.routed.end());
    counts.push_back(static_cast<double>(tokens));
    const int64_t ranks = data_parallel_.sum ? data_parallel_.size : 1;
    if (data_parallel_.sum) counts = data_parallel_.sum(counts);
    const double all_tokens = counts[e];
    if (all_tokens == 0) return ops::reshape(out, x.shape());  // no token anywhere: no loss
    std::vector<float> share(e);
    for (int64_t i = 0; i < e; ++i) {
      share[i] = static_cast<float>(counts[i] / (all_tokens * static_cast<double>(k)));
    }
    const Tensor f = ops::to(ops::from_vector(share, {1, e}), x.device());
    // Each rank's share of the mean over all tokens, times the ranks: the gradients' mean over
    // the ranks (data parallelism averages them) is the whole batch's loss's.
    const double scale =
        options_.aux_loss_coeff * static_cast<double>(e) * static_cast<double>(ranks) / all_tokens;
    const Tensor aux = ops::mul(ops::sum(ops::mul(normalized, f)), scale);
    if (!x.device().is_meta()) aux_value = aux.item<double>();
    out = attach_auxiliary_loss(out, aux);
  }

  // Counted once per training forward: not in a checkpoint's recompute (counted in its forward),
  // nor in evaluation (validation, sampling: train(false)), which must not move the bias.
  if (in_checkpoint_recompute() || !is_training()) return ops::reshape(out, x.shape());
  for (int64_t i = 0; i < e; ++i) {
    stats_.tokens_per_expert[i] += routing.routed[i];
    load_since_update_[i] += routing.routed[i];
  }
  stats_.aux_loss += aux_value * AuxiliaryLossScale::current();  // a micro-batch's share
  stats_.dropped += routing.dropped();
  ++stats_.calls;
  return ops::reshape(out, x.shape());
}

RouterStats MoE::take_stats() {
  RouterStats taken = std::move(stats_);
  stats_ = RouterStats{};
  stats_.tokens_per_expert.assign(options_.num_experts, 0);
  return taken;
}

void MoE::set_load_since_update(std::vector<int64_t> load) {
  LOOM_CHECK(static_cast<int64_t>(load.size()) == options_.num_experts,
             "MoE::set_load_since_update: {} loads for {} experts", load.size(),
             options_.num_experts);
  load_since_update_ = std::move(load);
}

void MoE::set_data_parallel(MoEDataParallel data_parallel) {
  LOOM_CHECK(data_parallel.size >= 1, "MoE::set_data_parallel: size must be >= 1, got {}",
             data_parallel.size);
  data_parallel_ = std::move(data_parallel);
}

void MoE::update_expert_bias() {
  if (options_.bias_update_rate > 0) {
    const double mean = std::accumulate(load_since_update_.begin(), load_since_update_.end(), 0.0) /
                        static_cast<double>(options_.num_experts);
    std::vector<float> step(options_.num_experts);
    for (int64_t i = 0; i < options_.num_experts; ++i) {
      const double gap = mean - static_cast<double>(load_since_update_[i]);
      step[i] = static_cast<float>(options_.bias_update_rate * ((gap > 0) - (gap < 0)));
    }
    ops::add_(expert_bias_,
              ops::to(ops::from_vector(step, {options_.num_experts}), expert_bias_.device()));
  }
  load_since_update_.assign(options_.num_experts, 0);
}

}  // namespace loom::nn
