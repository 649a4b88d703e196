// DeepSeek-V3 against Hugging Face transformers: a DeepseekV3ForCausalLM checkpoint written by
// transformers (tests/models/fixtures/make_hf_deepseek_v3_fixture.py: multi-head latent attention
// with low-rank queries and interleaved RoPE under DeepSeek-V3's YaRN, a dense first layer, then 8
// experts chosen top-3 by sigmoid scores plus a nonzero e_score_correction_bias from each token's
// best 2 of 4 expert groups, the weights normalized and scaled by 2.5, one shared expert) loads
// into Loom's Llama — names mapped, one file tensor per expert, the bias into the MoE's expert_bias
// buffer, config.json read — and gives the logits PyTorch computed, to 1e-5 of their largest
// magnitude (the latent norms dividing by 1e-6 as transformers', the others by rms_norm_eps 1e-5):
// on 1 rank, with the experts over ep = 2 (each rank reading its own) and the heads over tp = 2.
// The bias chooses experts though no balancing moves it (a loaded model's bias is part of it), and
// without it, or without the group limit, the logits are others. An export from ep ranks reads
// back as the same model, bias included; what DeepSeek-V3's format cannot hold is named.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>

#include "autograd/grad_mode.h"
#include "comm/testing/multi_rank.h"
#include "dtensor/dtensor.h"
#include "models/hf/safetensors.h"
#include "models/llama/hf.h"
#include "models/llama/plans.h"
#include "parallel/ep/expert_parallel.h"
#include "tensor/ops.h"
#include "tests/models/hf_reference.h"
#include "tests/testing/errors.h"
#include "tests/testing/tensor_checks.h"

namespace loom::models {
namespace {

using loom::testing::expect_close;
using loom::testing::RelativeTo;
using loom::testing::Tolerance;

constexpr const char* kCheckpoint = "tests/models/fixtures/hf_deepseek_v3_tiny.safetensors";
constexpr const char* kConfig = "tests/models/fixtures/hf_deepseek_v3_tiny_config.json";
constexpr const char* kExpected = "tests/models/fixtures/hf_deepseek_v3_tiny_logits.json";
constexpr Tolerance kTol{.rtol = 1e-5, .relative_to = RelativeTo::kLargest};

std::shared_ptr<const DeviceMesh> mesh_of(comm::ProcessGroup& pg, const char* dim) {
  return std::make_shared<const DeviceMesh>(pg.shared_from_this(), std::vector<std::string>{dim},
                                            std::vector<int64_t>{pg.size()});
}

TEST(DeepSeekV3ReferenceTest, ConfigJsonIsLatentAttentionAndSigmoidRoutedExperts) {
  const LlamaConfig config = read_llama_hf_config(kConfig);
  ASSERT_TRUE(config.mla.has_value());
  EXPECT_EQ(config.mla->q_lora_rank, 32);
  EXPECT_EQ(config.mla->kv_lora_rank, 16);
  EXPECT_EQ(config.mla->qk_nope_head_dim, 16);
  EXPECT_EQ(config.mla->qk_rope_head_dim, 8);
  EXPECT_EQ(config.mla->v_head_dim, 16);
  ASSERT_TRUE(config.moe.has_value());
  EXPECT_EQ(config.moe->num_experts, 8);
  EXPECT_EQ(config.moe->top_k, 3);
  EXPECT_EQ(config.moe->num_expert_groups, 4);
  EXPECT_EQ(config.moe->num_limited_groups, 2);
  EXPECT_EQ(config.moe->hidden_dim, 24);
  EXPECT_EQ(config.moe->num_shared_experts, 1);
  EXPECT_EQ(config.moe->score_func, "sigmoid");
  EXPECT_TRUE(config.moe->route_norm);
  EXPECT_EQ(config.moe->route_scale, 2.5);
  EXPECT_EQ(config.moe_dense_layers, 1);
  EXPECT_EQ(config.ffn_hidden_dim(), 96);
  EXPECT_EQ(config.norm_eps, 1e-5);
  ASSERT_TRUE(config.rope_yarn.has_value());
  EXPECT_EQ(config.rope_yarn->factor, 4.0);
  EXPECT_EQ(config.rope_yarn->original_max_position_embeddings, 32);
  EXPECT_DOUBLE_EQ(config.rope_yarn->cos_sin_factor(), 1.0);  // mscale over mscale_all_dim
  EXPECT_DOUBLE_EQ(config.rope_yarn->softmax_factor(),
                   (1 + 0.1 * std::log(4.0)) * (1 + 0.1 * std::log(4.0)));
  EXPECT_EQ(hf_format_gap(config), "");
}

TEST(DeepSeekV3ReferenceTest, TransformersCheckpointGivesTransformersLogits) {
  const auto ref = testing::read_hf_reference(kExpected);
  Llama model(read_llama_hf_config(kConfig), /*seed=*/5);
  load_llama_hf(model, kCheckpoint);
  EXPECT_EQ(ops::to_vector(model.layers[1]->moe->expert_bias()),
            (std::vector<double>{0.3f, -0.2f, 0.05f, -0.1f, 0.0f, 0.15f, -0.25f, 0.1f}));
  model.train(false);
  NoGradGuard no_grad;
  const Tensor logits = model(ref.ids);
  ASSERT_EQ(logits.shape(), ref.logits_shape);
  expect_close({.actual = logits, .expected = ref.logits, .tol = kTol, .what = "logits"});
}

// The largest difference from transformers' logits of the fixture's model changed by `change`.
double largest_gap_after(const std::function<void(LlamaConfig&, Llama&)>& change) {
  const auto ref = testing::read_hf_reference(kExpected);
  LlamaConfig config = read_llama_hf_config(kConfig);
  Llama unchanged(config, /*seed=*/5);
  change(config, unchanged);
  Llama model(config, /*seed=*/5);
  load_llama_hf(model, kCheckpoint);
  change(config, model);
  model.train(false);
  NoGradGuard no_grad;
  const std::vector<double> logits = ops::to_vector(model(ref.ids));
  double largest_gap = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    largest_gap = std::max(largest_gap, std::abs(logits[i] - ref.logits[i]));
  }
  return largest_gap;
}

// The bias and the group limit change the choices: without either the logits are others (the
// fixture's are not too small to matter).
TEST(DeepSeekV3ReferenceTest, TheBiasAndTheGroupLimitChangeTheChoices) {
  EXPECT_GT(largest_gap_after([](LlamaConfig&, Llama& model) {
              ops::fill_(const_cast<Tensor&>(model.layers[1]->moe->expert_bias()), 0.0);
            }),
            1e-2);
  EXPECT_GT(
      largest_gap_after([](LlamaConfig& config, Llama&) { config.moe->num_limited_groups = 0; }),
      1e-2);
}

TEST(DeepSeekV3ReferenceTest, ExpertAndTensorParallelRanksGiveTransformersLogits) {
  const auto ref = testing::read_hf_reference(kExpected);
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    {
      Llama model(read_llama_hf_config(kConfig), /*seed=*/5);
      parallel::ep::expert_parallel(*model.layers[1]->moe, mesh_of(pg, "ep"));
      load_llama_hf(model, kCheckpoint);
      EXPECT_EQ(local_shard(model.layers[1]->moe->experts->w1()).size(0), 4);
      model.train(false);
      NoGradGuard no_grad;
      expect_close(
          {.actual = model(ref.ids), .expected = ref.logits, .tol = kTol, .what = "ep2 logits"});
    }
    Llama model(read_llama_hf_config(kConfig), /*seed=*/5);
    parallelize_llama(model, mesh_of(pg, "tp"), {.sequence_parallel = true});
    load_llama_hf(model, kCheckpoint);
    model.train(false);
    NoGradGuard no_grad;
    expect_close({.actual = full_tensor(model(ref.ids)),
                  .expected = ref.logits,
                  .tol = kTol,
                  .what = "tp2 logits"});
  });
}

// Export from ep ranks (the experts gathered), then import: every parameter and the bias equal,
// transformers' tensors under their names, and a config.json that reads back to the config.
TEST(DeepSeekV3ReferenceTest, ExportFromExpertParallelRanksReadsBackAsTheSameModel) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/export";
  std::filesystem::create_directories(dir);
  const std::string file = dir + "/model.safetensors";
  const LlamaConfig config = read_llama_hf_config(kConfig);
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    Llama model(config, /*seed=*/5);
    load_llama_hf(model, kCheckpoint);
    parallel::ep::expert_parallel(*model.layers[1]->moe, mesh_of(pg, "ep"));
    save_llama_hf(model, file, /*write=*/pg.rank() == 0);
  });
  const hf::ConfigJson json = hf::ConfigJson::read(dir + "/config.json");
  EXPECT_EQ(json.string_or("model_type", ""), "deepseek_v3");
  const TensorMap written = load_safetensors(file).tensors,
                  original = load_safetensors(kCheckpoint).tensors;
  EXPECT_EQ(written.size(), original.size());
  for (const auto& [name, tensor] : original) {
    ASSERT_TRUE(written.count(name)) << name;
    EXPECT_EQ(ops::to_vector(written.at(name)), ops::to_vector(tensor)) << name;
  }
  const LlamaConfig read_back = read_llama_hf_config(dir + "/config.json");
  EXPECT_EQ(read_back.parameter_count(), config.parameter_count());
  EXPECT_EQ(read_back.active_parameter_count(), config.active_parameter_count());
}

TEST(DeepSeekV3ReferenceTest, WhatTheFormatCannotHoldIsNamed) {
  LlamaConfig config = read_llama_hf_config(kConfig);
  config.moe->score_func = "softmax";
  EXPECT_THAT(hf_format_gap(config), ::testing::HasSubstr("softmax router scores"));
  config = read_llama_hf_config(kConfig);
  config.moe->num_shared_experts = 0;
  EXPECT_THAT(hf_format_gap(config), ::testing::HasSubstr("no shared expert"));
  config = read_llama_hf_config(kConfig);
  config.moe.reset();
  EXPECT_THAT(hf_format_gap(config), ::testing::HasSubstr("without a mixture of experts"));
  // Read: groups that do not split the experts, and a RoPE Loom does not compute, are refused.
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/refused";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/config.json";
  nlohmann::json json = hf::ConfigJson::read(kConfig).json();
  json["n_group"] = 3;
  std::ofstream(path) << json.dump();
  EXPECT_THAT(loom::testing::error_of([&] { read_llama_hf_config(path); }),
              ::testing::HasSubstr("num_expert_groups 3 must be >= 1 and divide num_experts = 8"));
  json = hf::ConfigJson::read(kConfig).json();
  json["rope_parameters"] = {{"rope_type", "dynamic"}, {"factor", 4.0}, {"rope_theta", 10000.0}};
  std::ofstream(path) << json.dump();
  EXPECT_THAT(loom::testing::error_of([&] { read_llama_hf_config(path); }),
              ::testing::HasSubstr("not \"dynamic\""));
}

}  // namespace
}  // namespace loom::models
