// Loom's multi-head latent attention and DeepSeek-V3 routing against Hugging Face transformers:
// a tiny DeepseekV3ForCausalLM (tests/models/fixtures/make_hf_deepseek_v3_fixture.py: latent
// attention with low-rank queries and interleaved RoPE, a dense first layer, then 4 experts
// chosen top-2 by sigmoid scores plus a nonzero e_score_correction_bias, the weights normalized
// and scaled by 2.5, one shared expert), its parameters written under Loom's names by the script.
// Loom's Llama of the same config gives the logits PyTorch computed, to 1e-5 of their largest
// magnitude (the latent norms dividing by 1e-6 as transformers', the others by rms_norm_eps
// 1e-5), on 1 rank, with the experts over ep = 2 and the heads over tp = 2: the bias chooses
// experts though no balancing moves it (a loaded model's bias is part of it).
#include <gtest/gtest.h>

#include "autograd/grad_mode.h"
#include "comm/testing/multi_rank.h"
#include "dtensor/dtensor.h"
#include "models/hf/safetensors.h"
#include "models/llama/llama.h"
#include "models/llama/plans.h"
#include "parallel/ep/expert_parallel.h"
#include "tensor/ops.h"
#include "tests/models/hf_reference.h"
#include "tests/testing/tensor_checks.h"

namespace loom::models {
namespace {

using loom::testing::expect_close;
using loom::testing::RelativeTo;
using loom::testing::Tolerance;

constexpr const char* kParameters =
    "tests/models/fixtures/hf_deepseek_v3_tiny_loom_names.safetensors";
constexpr const char* kExpected = "tests/models/fixtures/hf_deepseek_v3_tiny_logits.json";
constexpr Tolerance kTol{.rtol = 1e-5, .relative_to = RelativeTo::kLargest};

// The script's DeepseekV3Config in Loom's terms.
LlamaConfig deepseek_v3_tiny() {
  return LlamaConfig{.dim = 64,
                     .n_layers = 2,
                     .n_heads = 4,
                     .n_kv_heads = 4,
                     .vocab_size = 257,
                     .ffn_dim = 96,
                     .norm_eps = 1e-5,
                     .rope_theta = 10000.0,
                     .rope_scaling = std::nullopt,
                     .max_seq_len = 128,
                     .moe = nn::MoEOptions{.num_experts = 4,
                                           .top_k = 2,
                                           .hidden_dim = 24,
                                           .num_shared_experts = 1,
                                           .score_func = "sigmoid",
                                           .route_norm = true,
                                           .route_scale = 2.5},
                     .moe_dense_layers = 1,
                     .mla = MLAOptions{.q_lora_rank = 32,
                                       .kv_lora_rank = 16,
                                       .qk_nope_head_dim = 16,
                                       .qk_rope_head_dim = 8,
                                       .v_head_dim = 16}};
}

// The fixture's tensors into `model` (before any parallelization): every parameter and the
// routing bias, by Loom's names.
void load_fixture(Llama& model) {
  const TensorMap file = load_safetensors(kParameters).tensors;
  const nn::StateDict state = model.state_dict();
  nn::StateDict values;
  for (const auto& [name, tensor] : state) {
    ASSERT_TRUE(file.count(name)) << "the fixture lacks " << name;
    values.emplace(name, file.at(name));
  }
  EXPECT_EQ(values.size(), file.size()) << "the fixture holds tensors the model does not";
  model.load_state_dict(values);
}

TEST(DeepSeekV3ReferenceTest, LatentAttentionAndSigmoidRoutingGiveTransformersLogits) {
  const auto ref = testing::read_hf_reference(kExpected);
  Llama model(deepseek_v3_tiny(), /*seed=*/5);
  load_fixture(model);
  model.train(false);
  NoGradGuard no_grad;
  const Tensor logits = model(ref.ids);
  ASSERT_EQ(logits.shape(), ref.logits_shape);
  expect_close({.actual = logits, .expected = ref.logits, .tol = kTol, .what = "logits"});
}

// The bias changes the choices: without it the logits are others (the fixture's bias is not
// too small to matter).
TEST(DeepSeekV3ReferenceTest, TheBiasChangesTheChoices) {
  const auto ref = testing::read_hf_reference(kExpected);
  Llama model(deepseek_v3_tiny(), /*seed=*/5);
  load_fixture(model);
  model.train(false);
  ops::fill_(const_cast<Tensor&>(model.layers[1]->moe->expert_bias()), 0.0);
  NoGradGuard no_grad;
  const std::vector<double> logits = ops::to_vector(model(ref.ids));
  double largest_gap = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    largest_gap = std::max(largest_gap, std::abs(logits[i] - ref.logits[i]));
  }
  EXPECT_GT(largest_gap, 1e-2);
}

TEST(DeepSeekV3ReferenceTest, ExpertAndTensorParallelRanksGiveTransformersLogits) {
  const auto ref = testing::read_hf_reference(kExpected);
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    const auto mesh = [&](const char* dim) {
      return std::make_shared<const DeviceMesh>(
          pg.shared_from_this(), std::vector<std::string>{dim}, std::vector<int64_t>{2});
    };
    {
      Llama model(deepseek_v3_tiny(), /*seed=*/5);
      load_fixture(model);
      parallel::ep::expert_parallel(*model.layers[1]->moe, mesh("ep"));
      model.train(false);
      NoGradGuard no_grad;
      expect_close(
          {.actual = model(ref.ids), .expected = ref.logits, .tol = kTol, .what = "ep2 logits"});
    }
    Llama model(deepseek_v3_tiny(), /*seed=*/5);
    load_fixture(model);
    parallelize_llama(model, mesh("tp"), {.sequence_parallel = true});
    model.train(false);
    NoGradGuard no_grad;
    expect_close({.actual = full_tensor(model(ref.ids)),
                  .expected = ref.logits,
                  .tol = kTol,
                  .what = "tp2 logits"});
  });
}

}  // namespace
}  // namespace loom::models
