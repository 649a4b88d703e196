// The Llama model on one rank: its sizes and names, RoPE's properties (Llama 3's frequency
// scaling, rotation by relative position), grouped-query attention against the same model with
// its kv heads duplicated into full multi-head attention, and a few AdamW steps that learn.
#include "models/llama/llama.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "base/error.h"
#include "optim/optimizer.h"
#include "tensor/ops.h"
#include "tests/models/attention_dropout_checks.h"
#include "tests/models/random_tokens.h"
#include "tests/testing/tensor_checks.h"

namespace loom::models {
namespace {

using loom::testing::expect_close;

LlamaConfig tiny() { return LlamaConfig::preset("llama-tiny"); }

TEST(LlamaTest, SizesAndNamesAreLlamas) {
  Llama model(tiny(), 1);
  int64_t count = 0;
  for (const auto& [name, p] : model.named_parameters()) count += p.numel();
  EXPECT_EQ(count, tiny().parameter_count());
  const auto params = model.state_dict();
  EXPECT_EQ(params.at("tok_embeddings.weight").shape(), (Shape{257, 64}));
  EXPECT_EQ(params.at("layers.1.attention.wk.weight").shape(), (Shape{32, 64}));  // 2 kv heads
  EXPECT_EQ(params.at("layers.0.feed_forward.w1.weight").shape(), (Shape{176, 64}));
  EXPECT_EQ(params.at("layers.0.attention_norm.weight").shape(), (Shape{64}));
  EXPECT_EQ(params.at("output.weight").shape(), (Shape{257, 64}));
  EXPECT_EQ(params.count("layers.0.attention.wq.bias"), 0u) << "projections are bias-free";
  const Tensor ids = testing::random_tokens({2, 9}, 3, 257);
  EXPECT_EQ(model(ids).shape(), (Shape{2, 9, 257}));
}

TEST(LlamaTest, RopeTablesFollowLlama3Scaling) {
  // llama-tiny: head_dim 16, theta 1e4, factor 4, original context 32: wavelengths under 8 keep
  // their frequency, over 32 are slowed 4x, and between blend smoothly.
  const LlamaConfig config = tiny();
  const RopeTables tables = rope_tables(config);
  const auto sin1 = ops::to_vector(ops::narrow(tables.sin, 0, 1, 1));  // angle = frequency
  for (int i = 0; i < 8; ++i) {
    const double f = std::pow(1e4, -2.0 * i / 16);
    const double wavelen = 2 * std::numbers::pi / f;
    double want = f;
    if (wavelen > 32) {
      want = f / 4;
    } else if (wavelen >= 8) {
      const double smooth = (32 / wavelen - 1) / (4 - 1);
      want = (1 - smooth) * f / 4 + smooth * f;
    }
    EXPECT_NEAR(std::asin(sin1[i]), want, 1e-6) << "frequency " << i;
  }
  // Position 0 is not rotated.
  const Tensor x = ops::uniform({1, 3, 4, 16}, 5, -1.0, 1.0);
  expect_close({.actual = ops::narrow(apply_rope(x, tables), 1, 0, 1),
                .expected = ops::narrow(x, 1, 0, 1),
                .tol = {.atol = 1e-7},
                .what = "position 0"});
}

TEST(LlamaTest, RopeScoresDependOnRelativePositionOnly) {
  // The same query and key vector at every position: q_m . k_n depends on m - n only.
  const RopeTables tables = rope_tables(tiny());
  const Tensor q = ops::expand(ops::uniform({1, 1, 1, 16}, 7, -1.0, 1.0), {1, 12, 1, 16});
  const Tensor k = ops::expand(ops::uniform({1, 1, 1, 16}, 9, -1.0, 1.0), {1, 12, 1, 16});
  const auto rq = ops::to_vector(apply_rope(ops::contiguous(q), tables));
  const auto rk = ops::to_vector(apply_rope(ops::contiguous(k), tables));
  const auto score = [&](int m, int n) {
    double s = 0;
    for (int d = 0; d < 16; ++d) s += rq[m * 16 + d] * rk[n * 16 + d];
    return s;
  };
  for (int shift = 1; shift <= 3; ++shift) {
    EXPECT_NEAR(score(5, 2), score(5 - shift + 3, 2 - shift + 3), 1e-5);
    EXPECT_NEAR(score(2, 5), score(2 + shift, 5 + shift), 1e-5);
  }
}

TEST(LlamaTest, GroupedQueryAttentionIsMultiHeadWithSharedKvHeads) {
  // The GQA model (4 heads over 2 kv heads) equals the MHA model whose kv head h is a copy of
  // the GQA model's kv head h / 2.
  LlamaConfig mha_config = tiny();
  mha_config.n_kv_heads = mha_config.n_heads;
  Llama gqa(tiny(), 1), mha(mha_config, 2);
  NoGradGuard no_grad;
  auto mha_params = mha.state_dict();
  for (const auto& [name, p] : gqa.named_parameters()) {
    Tensor dst = mha_params.at(name);
    const bool kv = name.find("attention.wk") != std::string::npos ||
                    name.find("attention.wv") != std::string::npos;
    if (!kv) {
      ops::copy_(dst, p);
      continue;
    }
    for (int64_t h = 0; h < 4; ++h) {  // head_dim 16 rows per head
      ops::copy_(ops::narrow(dst, 0, h * 16, 16), ops::narrow(p, 0, (h / 2) * 16, 16));
    }
  }
  const Tensor ids = testing::random_tokens({2, 11}, 4, 257);
  expect_close({.actual = gqa(ids),
                .expected = mha(ids),
                .tol = {.rtol = 1e-5, .atol = 1e-6},
                .what = "GQA vs MHA with shared kv heads"});
}

// HF's attention_dropout: the mask is drawn in the attention kernels in training only, a new one
// per call, the same for the same seed; grouped-query and latent attention alike.
TEST(LlamaTest, AttentionDropoutDropsInTrainingOnlyAndRepeats) {
  for (bool latent : {false, true}) {
    SCOPED_TRACE(latent ? "latent attention" : "grouped-query attention");
    LlamaConfig plain = tiny();
    if (latent) {
      plain.mla = MLAOptions{.q_lora_rank = 0,
                             .kv_lora_rank = 16,
                             .qk_nope_head_dim = 8,
                             .qk_rope_head_dim = 8,
                             .v_head_dim = 8};
    }
    LlamaConfig dropping = plain;
    dropping.attention_dropout = 0.2;
    const Tensor x = testing::random_tokens({2, 16}, 10, 257);
    const Tensor y = testing::random_tokens({2, 16}, 11, 257);
    Llama a(dropping, 5), b(dropping, 5), reference(plain, 5);
    loom::testing::expect_attention_dropout_draws(a, b, reference,
                                                  "layers.0.attention.attn_dropout", x, y);
  }
  LlamaConfig bad = tiny();
  bad.attention_dropout = 1.0;
  try {
    bad.validate();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "LlamaConfig: attention_dropout must be in [0, 1), got 1");
  }
}

TEST(LlamaTest, AdamWStepsLearn) {
  Llama model(tiny(), 3);
  optim::AdamW adamw(model.parameters(), {.lr = 3e-3, .weight_decay = 0.0});
  const Tensor ids = testing::random_tokens({4, 16}, 6, 257);
  const Tensor targets = testing::random_tokens({4, 16}, 8, 257);
  std::vector<double> losses;
  for (int step = 0; step < 8; ++step) {
    adamw.zero_grad();
    Tensor loss = model.loss(ids, targets);
    backward(loss);
    for (const auto& [name, p] : model.named_parameters()) {
      ASSERT_TRUE(p.grad().defined()) << name;
    }
    adamw.step();
    losses.push_back(loss.item<double>());
  }
  EXPECT_NEAR(losses.front(), std::log(257.0), 0.3) << "an untrained model is near uniform";
  EXPECT_LT(losses.back(), losses.front() - 0.5);
}

}  // namespace
}  // namespace loom::models
