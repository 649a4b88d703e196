#include "models/gpt/gpt.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "base/error.h"
#include "optim/optimizer.h"
#include "tensor/ops.h"
#include "tests/models/attention_dropout_checks.h"
#include "tests/models/random_tokens.h"

namespace loom::models {
namespace {

using ::testing::HasSubstr;

int64_t count_parameters(const nn::Module& m) {
  int64_t n = 0;
  for (const auto& [name, p] : m.named_parameters()) n += p.numel();
  return n;
}

using testing::random_tokens;

TEST(GPTTest, UsesGPT2TensorNamesAndParameterCount) {
  GPT model(GPTConfig::preset("tiny"));
  std::vector<std::string> names;
  for (const auto& [name, p] : model.named_parameters()) names.push_back(name);
  EXPECT_THAT(names,
              ::testing::ElementsAre(
                  "wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.ln_1.bias",
                  "h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias", "h.0.attn.c_proj.weight",
                  "h.0.attn.c_proj.bias", "h.0.ln_2.weight", "h.0.ln_2.bias", "h.0.mlp.c_fc.weight",
                  "h.0.mlp.c_fc.bias", "h.0.mlp.c_proj.weight", "h.0.mlp.c_proj.bias",
                  "h.1.ln_1.weight", "h.1.ln_1.bias", "h.1.attn.c_attn.weight",
                  "h.1.attn.c_attn.bias", "h.1.attn.c_proj.weight", "h.1.attn.c_proj.bias",
                  "h.1.ln_2.weight", "h.1.ln_2.bias", "h.1.mlp.c_fc.weight", "h.1.mlp.c_fc.bias",
                  "h.1.mlp.c_proj.weight", "h.1.mlp.c_proj.bias", "ln_f.weight", "ln_f.bias"));
  EXPECT_EQ(count_parameters(model), model.config().parameter_count());
  EXPECT_EQ(GPTConfig::preset("small").parameter_count(), 124439808);  // GPT-2 124M, head tied
  EXPECT_EQ(model.submodule("h.1.attn.c_attn").parameter("weight").shape(), (Shape{192, 64}));
}

TEST(GPTTest, InitializationFollowsGPT2) {
  GPTConfig config = GPTConfig::preset("tiny");
  GPT model(config, /*seed=*/3);
  auto state = model.state_dict();
  auto stddev = [](const Tensor& t) {
    const auto v = ops::to_vector(t);
    double mean = 0, sq = 0;
    for (double x : v) mean += x;
    mean /= v.size();
    for (double x : v) sq += (x - mean) * (x - mean);
    return std::sqrt(sq / v.size());
  };
  EXPECT_NEAR(stddev(state.at("h.0.attn.c_attn.weight")), 0.02,
              0.002);  // 12k samples: ~1% sampling error
  EXPECT_NEAR(stddev(state.at("h.0.mlp.c_proj.weight")), 0.02 / std::sqrt(2.0 * config.n_layer),
              0.0015);
  EXPECT_EQ(ops::to_vector(state.at("h.0.attn.c_attn.bias")), std::vector<double>(192, 0.0));
  EXPECT_EQ(ops::to_vector(state.at("ln_f.weight")), std::vector<double>(64, 1.0));
  // Same seed, same weights; a parameter's values depend on its name only.
  GPT again(config, 3);
  EXPECT_EQ(ops::to_vector(again.state_dict().at("h.1.mlp.c_fc.weight")),
            ops::to_vector(state.at("h.1.mlp.c_fc.weight")));
}

TEST(GPTTest, ForwardIsCausal) {
  GPT model(GPTConfig::preset("tiny"), 1);
  Tensor a = random_tokens({1, 16}, 5, 256);
  std::vector<double> ids = ops::to_vector(a);
  ids[10] = std::fmod(ids[10] + 1, 256);
  std::vector<int64_t> changed(ids.begin(), ids.end());
  Tensor b = ops::from_vector_i64(changed, {1, 16});
  const auto la = ops::to_vector(model(a)), lb = ops::to_vector(model(b));
  ASSERT_EQ(la.size(), 16u * 256u);
  // Positions 0..9 cannot see token 10: bit-identical logits. Position 10 must change.
  for (size_t i = 0; i < 10 * 256; ++i) ASSERT_EQ(la[i], lb[i]) << "position " << i / 256;
  double diff = 0;
  for (size_t i = 10 * 256; i < 11 * 256; ++i) diff += std::abs(la[i] - lb[i]);
  EXPECT_GT(diff, 0.0);
}

TEST(GPTTest, InitialLossIsNearUniformAndTrainingLowersIt) {
  GPT model(GPTConfig::preset("tiny"), 2);
  const Tensor x = random_tokens({4, 32}, 7, 256);
  const Tensor y = ops::contiguous(
      ops::slice(ops::cat(std::vector<Tensor>{x, x}, 1), 1, 1, 33));  // shifted copy
  Tensor loss = model.loss(x, y);
  // Small init: logits near 0, so the loss is near ln(256) = 5.545.
  EXPECT_NEAR(loss.item<double>(), std::log(256.0), 0.1);
  optim::AdamW opt(model.parameters(), optim::AdamWOptions{.lr = 3e-3, .weight_decay = 0.0});
  double first = loss.item<double>(), last = first;
  for (int step = 0; step < 15; ++step) {
    opt.zero_grad();
    backward(loss);
    opt.step();
    loss = model.loss(x, y);
    last = loss.item<double>();
  }
  EXPECT_LT(last, first - 1.0) << "loss " << first << " -> " << last;
}

// A forward that lost a parameter's gradient (an op that did not record, a detach, a write under
// NoGradGuard) leaves that parameter without one: every parameter must get a non-zero gradient.
TEST(GPTTest, EveryParameterGetsAGradient) {
  GPT model(GPTConfig::preset("tiny"), 3);
  const Tensor x = random_tokens({2, 16}, 8, 256);
  const Tensor y = random_tokens({2, 16}, 9, 256);
  backward(model.loss(x, y));
  for (const auto& [name, p] : model.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name << " got no gradient";
    double norm = 0;
    for (double g : ops::to_vector(p.grad())) norm += g * g;
    EXPECT_GT(norm, 0.0) << name << "'s gradient is all zeros";
  }
}

// Attention dropout (HF's attn_pdrop, drawn inside the attention kernels): it changes the
// training loss, repeats bit for bit for the same seed and call count (its attn_dropout module
// keeps the RNG state a checkpoint saves), and is off in evaluation.
TEST(GPTTest, AttentionDropoutDropsInTrainingOnlyAndRepeats) {
  GPTConfig plain = GPTConfig::preset("tiny");
  GPTConfig dropping = plain;
  dropping.attn_dropout = 0.2;
  const Tensor x = random_tokens({2, 16}, 10, 256), y = random_tokens({2, 16}, 11, 256);
  GPT a(dropping, 5), b(dropping, 5), reference(plain, 5);
  loom::testing::expect_attention_dropout_draws(a, b, reference, "h.0.attn.attn_dropout", x, y);
  dropping.attn_dropout = 1.0;
  try {
    GPT bad(dropping);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("GPTConfig: attn_dropout must be in [0, 1), got 1"));
  }
}

TEST(GPTTest, BadInputNamesShapes) {
  GPT model(GPTConfig::preset("tiny"));
  try {
    model(random_tokens({1, 65}, 1, 256));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("sequence length 65 exceeds block_size 64"));
  }
  try {
    GPT(GPTConfig{.n_head = 3, .n_embd = 64});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("n_embd=64 is not divisible by n_head=3"));
  }
}

}  // namespace
}  // namespace loom::models
