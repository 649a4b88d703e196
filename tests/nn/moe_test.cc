// The mixture-of-experts block (nn/moe) on one rank against a plain reference written here:
// every expert applied densely to every token and masked by the router's choices, with the
// routing recomputed here from the scores (top-k, lower expert on ties, capacity first come).
// Outputs and the gradients of the input and of every parameter within 1e-6 — softmax and
// sigmoid scores, normalized and scaled weights, shared experts, the auxiliary loss, capacity
// drops, top-k = E, an expert with no tokens, every token on one expert. Routing's own
// arithmetic (ties, capacity, offsets) and the expert bias are checked as plain values.
#include "nn/moe/moe.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/functions_nn.h"
#include "autograd/grouped_mm.h"
#include "base/error.h"
#include "nn/auxiliary_loss.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"
#include "tensor/rng.h"
#include "tests/testing/tensor_checks.h"

namespace loom::nn {

using ::testing::HasSubstr;
namespace {

constexpr int64_t kDim = 12, kTokens = 10;

// Which (token, expert) pairs the routing chose and kept, recomputed from the scores.
struct Choices {
  std::vector<float> chosen, kept;  // (tokens, experts) 0/1
  std::vector<int64_t> routed;      // per expert
};
Choices choose(const std::vector<double>& scores, const std::vector<double>& bias, int64_t tokens,
               int64_t experts, int64_t top_k, int64_t capacity) {
  Choices c{std::vector<float>(tokens * experts, 0), std::vector<float>(tokens * experts, 0),
            std::vector<int64_t>(experts, 0)};
  std::vector<int64_t> taken(experts, 0);
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<bool> used(experts, false);
    for (int64_t k = 0; k < top_k; ++k) {
      int64_t best = -1;
      for (int64_t e = 0; e < experts; ++e) {  // strictly greater: the lower expert wins a tie
        const double key = scores[t * experts + e] + (bias.empty() ? 0.0 : bias[e]);
        const double best_key =
            best < 0 ? -INFINITY : scores[t * experts + best] + (bias.empty() ? 0.0 : bias[best]);
        if (!used[e] && (best < 0 || key > best_key)) best = e;
      }
      used[best] = true;
      c.chosen[t * experts + best] = 1;
      ++c.routed[best];
      if (capacity < 0 || taken[best] < capacity) {
        ++taken[best];
        c.kept[t * experts + best] = 1;
      }
    }
  }
  return c;
}

// The dense reference: (output, aux loss) from the MoE's own parameters.
std::pair<Tensor, Tensor> dense_reference(MoE& moe, const Tensor& x) {
  const MoEOptions& o = moe.options();
  const int64_t e = o.num_experts;
  const Tensor flat = reshape(x, {-1, kDim});
  const int64_t tokens = flat.size(0);
  const Tensor logits = matmul(flat, transpose(moe.gate->weight(), 0, 1));
  const Tensor scores = o.score_func == "sigmoid" ? sigmoid(logits) : softmax(logits, -1);
  const Choices c =
      choose(ops::to_vector(scores),
             o.bias_update_rate > 0 ? ops::to_vector(moe.expert_bias()) : std::vector<double>{},
             tokens, e, o.top_k, expert_capacity(o.capacity_factor, tokens, o.top_k, e));
  const Tensor chosen = ops::from_vector(c.chosen, {tokens, e});
  const Tensor kept = ops::from_vector(c.kept, {tokens, e});
  Tensor mask = mul(scores, kept);
  if (o.route_norm) mask = div(mask, sum(mul(scores, chosen), {-1}, true));
  mask = mul(mask, o.route_scale);
  Tensor out = ops::zeros({tokens, kDim});
  for (int64_t i = 0; i < e; ++i) {
    const auto expert = [&](const Tensor& w) { return squeeze(narrow(w, 0, i, 1), 0); };
    const Tensor h = mul(silu(matmul(flat, transpose(expert(moe.experts->w1()), 0, 1))),
                         matmul(flat, transpose(expert(moe.experts->w3()), 0, 1)));
    const Tensor y = matmul(h, transpose(expert(moe.experts->w2()), 0, 1));
    out = add(out, mul(y, narrow(mask, 1, i, 1)));
  }
  if (moe.shared_experts) out = add(out, (*moe.shared_experts)(flat));
  Tensor aux = ops::zeros({});
  if (o.aux_loss_coeff > 0) {
    const Tensor p = o.score_func == "sigmoid" ? div(scores, sum(scores, {-1}, true)) : scores;
    std::vector<float> share(e);
    for (int64_t i = 0; i < e; ++i) share[i] = static_cast<float>(c.routed[i]) / (tokens * o.top_k);
    aux = mul(sum(mul(p, ops::from_vector(share, {1, e}))),
              o.aux_loss_coeff * static_cast<double>(e) / static_cast<double>(tokens));
  }
  return {reshape(out, x.shape()), aux};
}

struct Grads {
  Tensor out, dx;
  std::vector<std::pair<std::string, Tensor>> params;
};

Grads run(MoE& moe, const Tensor& x0, const Tensor& g, bool reference) {
  for (const auto& p : moe.parameters()) p.set_grad(Tensor());
  Tensor x = ops::clone(x0);
  x.set_requires_grad(true);
  Grads r;
  if (reference) {
    const auto [out, aux] = dense_reference(moe, x);
    r.out = out;
    backward(add(sum(mul(out, g)), aux));
  } else {
    r.out = moe(x);
    backward(sum(mul(r.out, g)));  // the auxiliary loss comes with the output
  }
  r.dx = x.grad();
  for (const auto& [name, p] : moe.named_parameters()) r.params.emplace_back(name, p.grad());
  return r;
}

void expect_like_dense(const MoEOptions& options, const std::string& what, uint64_t seed = 3) {
  SCOPED_TRACE(what);
  MoE moe(kDim, options, seed);
  const Tensor x = ops::normal({2, kTokens / 2, kDim}, seed + 10);
  const Tensor g = ops::normal({2, kTokens / 2, kDim}, seed + 11);
  const Grads got = run(moe, x, g, false);
  const Grads want = run(moe, x, g, true);
  const testing::Tolerance tol{.rtol = 1e-6, .atol = 1e-6};
  testing::expect_close({.actual = got.out, .expected = want.out, .tol = tol, .what = "output"});
  testing::expect_close({.actual = got.dx, .expected = want.dx, .tol = tol, .what = "dx"});
  ASSERT_EQ(got.params.size(), want.params.size());
  for (size_t i = 0; i < got.params.size(); ++i) {
    ASSERT_TRUE(got.params[i].second.defined()) << got.params[i].first << " has no gradient";
    testing::expect_close({.actual = got.params[i].second,
                           .expected = want.params[i].second,
                           .tol = tol,
                           .what = "gradient of " + got.params[i].first});
  }
}

TEST(MoETest, SoftmaxTopTwoEqualsTheDenseMaskedReference) {
  expect_like_dense({.num_experts = 4, .top_k = 2, .hidden_dim = 8}, "softmax top-2");
}

TEST(MoETest, SigmoidNormalizedScaledWithSharedExpertsAndAuxLoss) {
  expect_like_dense({.num_experts = 6,
                     .top_k = 3,
                     .hidden_dim = 8,
                     .num_shared_experts = 2,
                     .score_func = "sigmoid",
                     .route_norm = true,
                     .route_scale = 2.5,
                     .aux_loss_coeff = 0.01},
                    "DeepSeek-V3 style");
  expect_like_dense({.num_experts = 4, .top_k = 1, .hidden_dim = 8, .aux_loss_coeff = 0.1},
                    "softmax top-1 with the auxiliary loss");
}

TEST(MoETest, CapacityDropsTheLateTokensAndTopKOfAllExpertsWorks) {
  // capacity ceil(0.5 * 10 * 2 / 4) = 3 slots per expert: at least 8 of the 20 slots dropped.
  const MoEOptions half{.num_experts = 4, .top_k = 2, .hidden_dim = 8, .capacity_factor = 0.5};
  expect_like_dense(half, "capacity 0.5");
  MoE moe(kDim, half, 3);
  moe(ops::normal({2, kTokens / 2, kDim}, 13));
  const RouterStats stats = moe.take_stats();
  int64_t over = 0;
  for (int64_t n : stats.tokens_per_expert) over += std::max<int64_t>(n - 3, 0);
  EXPECT_EQ(stats.dropped, over) << "every slot beyond an expert's 3 dropped, no other";
  EXPECT_GE(stats.dropped, 8);
  expect_like_dense({.num_experts = 3, .top_k = 3, .hidden_dim = 8}, "top-k = E");
}

TEST(MoETest, EveryTokenOnOneExpertAndExpertsWithoutTokens) {
  // Expert 2's gate row all ones, the others zero, and inputs with every feature positive:
  // expert 2 has the largest logit for every token, experts 0, 1 and 3 get none.
  MoE moe(kDim, {.num_experts = 4, .top_k = 1, .hidden_dim = 8}, 3);
  {
    NoGradGuard no_grad;
    ops::fill_(moe.gate->weight(), 0.0);
    ops::fill_(ops::narrow(moe.gate->weight(), 0, 2, 1), 1.0);
  }
  const Tensor x = ops::add(ops::abs(ops::normal({1, kTokens, kDim}, 5)), 0.1);
  moe(x);
  const RouterStats stats = moe.take_stats();
  EXPECT_EQ(stats.tokens_per_expert, (std::vector<int64_t>{0, 0, kTokens, 0}));
  EXPECT_DOUBLE_EQ(stats.max_over_mean(), 4.0);
  EXPECT_DOUBLE_EQ(stats.min_over_mean(), 0.0);
  // The same routing against the dense reference (outputs and gradients).
  const Tensor g = ops::normal({1, kTokens, kDim}, 6);
  const Grads got = run(moe, x, g, false);
  const Grads want = run(moe, x, g, true);
  const testing::Tolerance tol{.rtol = 1e-6, .atol = 1e-6};
  testing::expect_close({.actual = got.out, .expected = want.out, .tol = tol, .what = "output"});
  testing::expect_close({.actual = got.dx, .expected = want.dx, .tol = tol, .what = "dx"});
  for (size_t i = 0; i < got.params.size(); ++i) {
    testing::expect_close({.actual = got.params[i].second,
                           .expected = want.params[i].second,
                           .tol = tol,
                           .what = "gradient of " + got.params[i].first});
  }
}

TEST(MoERoutingTest, TiesGoToTheLowerExpertAndCapacityKeepsTheEarliestTokens) {
  // Every score equal: each token picks experts 0 and 1.
  const std::vector<float> flat(3 * 4, 0.25f);
  const Routing r = route_top_k(flat, 3, 4, 2, {}, /*capacity=*/2);
  EXPECT_EQ(r.choice, (std::vector<int64_t>{0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(r.routed, (std::vector<int64_t>{3, 3, 0, 0}));
  // Capacity 2: token 2's slots dropped; experts 2 and 3 empty.
  EXPECT_EQ(r.offsets, (std::vector<int64_t>{0, 2, 4, 4, 4}));
  EXPECT_EQ(r.slot_token, (std::vector<int64_t>{0, 1, 0, 1}));
  EXPECT_EQ(r.slot_of, (std::vector<int64_t>{0, 2, 1, 3, 4, 4}));
  EXPECT_EQ(r.dropped(), 2);
  // A bias reorders the choice (here expert 3 first) without touching the scores.
  const std::vector<float> bias = {0, 0, 0, 0.5f};
  const Routing biased = route_top_k(flat, 3, 4, 2, bias, -1);
  EXPECT_EQ(biased.choice, (std::vector<int64_t>{3, 0, 3, 0, 3, 0}));
  EXPECT_EQ(biased.dropped(), 0);
  EXPECT_EQ(expert_capacity(0.0, 10, 2, 4), -1);
  EXPECT_EQ(expert_capacity(1.25, 10, 2, 4), 7);  // ceil(6.25)
}

// Choices made elsewhere (ops::top_k_indices on the scores' device) are placed as route_top_k
// places its own; impossible choices are named.
TEST(MoERoutingTest, ChoicesFromTheDevicePlaceAsTheHostsOwn) {
  const std::vector<float> scores = {0.1f, 0.7f, 0.2f, 0.0f, 0.3f, 0.3f,
                                     0.4f, 0.0f, 0.5f, 0.1f, 0.1f, 0.3f};
  const Routing host = route_top_k(scores, 3, 4, 2, {}, /*capacity=*/2);
  const std::vector<double> picked =
      ops::to_vector(ops::top_k_indices(ops::from_vector(scores, {3, 4}), 2));
  const Routing placed =
      place_choices(std::vector<int64_t>(picked.begin(), picked.end()), 3, 4, 2, /*capacity=*/2);
  EXPECT_EQ(placed.choice, host.choice);
  EXPECT_EQ(placed.routed, host.routed);
  EXPECT_EQ(placed.offsets, host.offsets);
  EXPECT_EQ(placed.slot_token, host.slot_token);
  EXPECT_EQ(placed.slot_of, host.slot_of);
  EXPECT_THAT(
      [] {
        place_choices({0, 4, 1, 2}, 2, 4, 2, -1);
      },
      ::testing::ThrowsMessage<Error>(
          HasSubstr("token 0's choice 1 is expert 4, expected one of [0, 4)")));
  EXPECT_THAT(
      [] {
        place_choices({0, 1, 2, 2}, 2, 4, 2, -1);
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("token 1 picked expert 2 twice")));
}

// Group-limited routing (DeepSeek-V3's): the groups whose two best keys sum highest are kept
// (a group's single best key does not decide), ties to the lower group, the others' keys -inf;
// a token with a NaN is left for its choice to name. Through the MoE, the choice stays in the
// kept groups.
TEST(MoERoutingTest, GroupLimitKeepsTheGroupsWhoseTwoBestKeysSumHighest) {
  // 8 experts in 4 groups of 2. Token 0: group 0 holds the single best key (0.9 + 0.0 = 0.9),
  // group 1 the best pair (0.5 + 0.5 = 1.0), group 2 0.8, group 3 0.2.
  std::vector<float> keys = {0.9f, 0.0f, 0.5f, 0.5f, 0.4f, 0.4f, 0.1f, 0.1f,
                             // Token 1: every group ties (0.2): the lower two are kept.
                             0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f};
  limit_to_groups(keys, 2, 8, 4, 2);
  const float inf = INFINITY;
  EXPECT_EQ(keys, (std::vector<float>{0.9f, 0.0f, 0.5f, 0.5f, -inf, -inf, -inf, -inf, 0.1f, 0.1f,
                                      0.1f, 0.1f, -inf, -inf, -inf, -inf}));
  std::vector<float> with_nan = {NAN, 0.0f, 0.5f, 0.5f};
  limit_to_groups(with_nan, 1, 4, 2, 1);
  EXPECT_TRUE(std::isnan(with_nan[0]));
  EXPECT_EQ(with_nan[3], 0.5f);

  MoE moe(kDim,
          {.num_experts = 8,
           .top_k = 3,
           .hidden_dim = 8,
           .score_func = "sigmoid",
           .num_expert_groups = 4,
           .num_limited_groups = 2,
           .route_norm = true},
          3);
  const Tensor x = ops::normal({kTokens, kDim}, 5);
  NoGradGuard no_grad;
  moe(x);
  const RouterStats stats = moe.take_stats();
  EXPECT_EQ(
      std::accumulate(stats.tokens_per_expert.begin(), stats.tokens_per_expert.end(), int64_t{0}),
      kTokens * 3);
  // The same choices as the host's: keys masked, then the top 3.
  const Tensor scores = ops::sigmoid(ops::to(moe.gate->forward(x), kFloat32));
  const std::vector<double> values = ops::to_vector(scores);
  std::vector<float> host(values.begin(), values.end());
  limit_to_groups(host, kTokens, 8, 4, 2);
  const std::vector<double> picked =
      ops::to_vector(ops::top_k_indices(ops::from_vector(host, {kTokens, 8}), 3));
  const Routing want =
      place_choices(std::vector<int64_t>(picked.begin(), picked.end()), kTokens, 8, 3, -1);
  EXPECT_EQ(stats.tokens_per_expert, want.routed);
  for (int64_t t = 0; t < kTokens; ++t) {
    std::set<int64_t> groups;
    for (int64_t k = 0; k < 3; ++k) groups.insert(want.choice[t * 3 + k] / 2);
    EXPECT_LE(groups.size(), 2u) << "token " << t;
  }
}

// The router and the shared experts run as modules (through operator()), as the experts do:
// hooks installed on them (a user's, FSDP's gathers) run once per forward.
TEST(MoETest, EverySubmodulesHooksRun) {
  MoE moe(kDim, {.num_experts = 4, .top_k = 2, .hidden_dim = 8, .num_shared_experts = 1}, 3);
  int gate = 0, shared = 0, experts = 0;
  const auto count = [](int& calls) {
    return [&calls](Module&, const Tensor&, const Tensor& out) {
      ++calls;
      return out;
    };
  };
  moe.gate->register_forward_hook(count(gate));
  moe.shared_experts->register_forward_hook(count(shared));
  moe.experts->register_forward_hook(count(experts));
  moe(ops::normal({kTokens, kDim}, 5));
  EXPECT_EQ(gate, 1);
  EXPECT_EQ(shared, 1);
  EXPECT_EQ(experts, 1);
}

// A router whose scores went NaN (a diverged run) stops the forward naming the token, on the
// device's choices as on the host's.
TEST(MoETest, ANanScoreIsNamed) {
  MoE moe(kDim, {.num_experts = 4, .top_k = 2, .hidden_dim = 8}, 3);
  ops::fill_(moe.gate->parameter("weight"), std::nan(""));
  EXPECT_THAT(
      [&] {
        moe(ops::normal({1, 2, kDim}, 5));
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("token 0's router scores hold a NaN")));
}

TEST(MoETest, TheExpertBiasMovesTowardBalanceAndRoutesWithoutWeighting) {
  MoE moe(kDim, {.num_experts = 4, .top_k = 1, .hidden_dim = 8, .bias_update_rate = 0.125}, 3);
  moe.set_load_since_update({6, 2, 2, 0});  // mean 2.5
  moe.update_expert_bias();
  testing::expect_equal(
      {.actual = moe.expert_bias(), .expected = {-0.125, 0.125, 0.125, 0.125}, .what = "bias"});
  EXPECT_EQ(moe.load_since_update(), (std::vector<int64_t>{0, 0, 0, 0}));
  // With the bias in place the block still equals the reference, which routes by scores + bias
  // and weights by the scores alone.
  expect_like_dense({.num_experts = 4, .top_k = 2, .hidden_dim = 8, .bias_update_rate = 0.125},
                    "with an expert bias");
}

// Under a micro-batch scale (gradient accumulation, a pipeline) the auxiliary loss enters as the
// loss does; checkpointed, the block recomputes with the forward's scale and counts its routing
// once.
TEST(MoETest, AuxiliaryLossScaleAndCheckpointing) {
  const MoEOptions options{.num_experts = 4, .top_k = 2, .hidden_dim = 8, .aux_loss_coeff = 0.5};
  const Tensor x0 = ops::normal({2, kTokens / 2, kDim}, 21),
               g = ops::normal({2, kTokens / 2, kDim}, 22);
  const auto gate_grad = [&](bool checkpointed, double scale, RouterStats* stats) {
    MoE moe(kDim, options, 3);
    moe.set_checkpointed(checkpointed);
    Tensor x = ops::clone(x0);
    x.set_requires_grad(true);
    Tensor loss;
    {
      AuxiliaryLossScale micro(scale);
      loss = mul(sum(mul(moe(x), g)), scale);
    }
    backward(loss);
    if (stats != nullptr) *stats = moe.take_stats();
    return moe.gate->weight().grad();
  };
  // The reference: the same block's dense computation with its aux loss scaled by hand.
  MoE moe(kDim, options, 3);
  Tensor x = ops::clone(x0);
  x.set_requires_grad(true);
  const auto [out, aux] = dense_reference(moe, x);
  backward(mul(add(sum(mul(out, g)), aux), 0.25));
  const testing::Tolerance tol{.rtol = 1e-6, .atol = 1e-6};
  RouterStats plain_stats, checkpointed_stats;
  testing::expect_close({.actual = gate_grad(false, 0.25, &plain_stats),
                         .expected = moe.gate->weight().grad(),
                         .tol = tol,
                         .what = "gate gradient at scale 1/4"});
  testing::expect_close({.actual = gate_grad(true, 0.25, &checkpointed_stats),
                         .expected = moe.gate->weight().grad(),
                         .tol = tol,
                         .what = "checkpointed gate gradient at scale 1/4"});
  EXPECT_EQ(checkpointed_stats.tokens_per_expert, plain_stats.tokens_per_expert);
  EXPECT_EQ(checkpointed_stats.calls, 1);
  EXPECT_DOUBLE_EQ(checkpointed_stats.aux_loss, plain_stats.aux_loss);
}

// Evaluation (validation, sampling: train(false)) routes as training does but counts nothing: the
// next training step's bias update and statistics see the training tokens only.
TEST(MoETest, EvaluationCountsNoLoad) {
  MoE moe(kDim, {.num_experts = 4, .top_k = 2, .hidden_dim = 8, .bias_update_rate = 0.1}, 3);
  moe.train(false);
  moe(ops::normal({2, kTokens / 2, kDim}, 31));
  EXPECT_EQ(moe.load_since_update(), (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_EQ(moe.take_stats().calls, 0);
  moe.train(true);
  moe(ops::normal({2, kTokens / 2, kDim}, 31));
  const std::vector<int64_t>& load = moe.load_since_update();
  EXPECT_EQ(std::accumulate(load.begin(), load.end(), int64_t{0}), kTokens * 2);
}

TEST(MoETest, RepeatsBitForBit) {
  const auto once = [] {
    MoE moe(kDim, {.num_experts = 8, .top_k = 2, .hidden_dim = 8, .capacity_factor = 1.0}, 7);
    const Tensor x = ops::normal({2, kTokens, kDim}, 8);
    return moe(x);
  };
  testing::expect_bitwise_equal({.actual = once(), .expected = once(), .what = "two runs"});
}

TEST(MoETest, BadOptionsAreNamed) {
  const auto message = [](const MoEOptions& o) {
    try {
      o.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(
      message({.num_experts = 4, .top_k = 5, .hidden_dim = 8})
          .find("top_k must be between 1 and num_experts = 4 (--moe-experts), got 5 (--moe-top-k"),
      std::string::npos);
  EXPECT_NE(
      message({.num_experts = 4, .top_k = 1, .hidden_dim = 8, .score_func = "relu"}).find("'relu'"),
      std::string::npos);
  EXPECT_NE(message({.num_experts = 4, .top_k = 1, .hidden_dim = 0}).find("hidden_dim"),
            std::string::npos);
  EXPECT_THAT(message({.num_experts = 6, .top_k = 1, .hidden_dim = 8, .num_expert_groups = 4}),
              HasSubstr("num_expert_groups 4 must be >= 1 and divide num_experts = 6"));
  EXPECT_THAT(
      message({.num_experts = 8,
               .top_k = 5,
               .hidden_dim = 8,
               .num_expert_groups = 4,
               .num_limited_groups = 2}),
      HasSubstr("top_k 5 is more than the 4 experts of num_limited_groups = 2 groups of 2"));
}

}  // namespace
}  // namespace loom::nn
