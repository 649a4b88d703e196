// Llama against Hugging Face transformers: a LlamaForCausalLM checkpoint written by transformers
// (tests/models/fixtures/make_hf_llama_fixture.py: llama-tiny's sizes, GQA, Llama 3 RoPE scaling
// over 40 positions) loads — names mapped, the rotary permutation undone, config.json read — and
// gives the logits PyTorch computed, to 1e-5 of their largest magnitude (f32 matmuls summing in
// another order). Also under tp = 2 with sequence parallelism after the load. The same for a
// checkpoint with tie_word_embeddings (Llama 3.2's small models): no lm_head.weight in the file,
// the head reads the embeddings; a file that holds lm_head.weight loads when it equals them and is
// refused, naming both, when it does not.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "autograd/grad_mode.h"
#include "comm/testing/multi_rank.h"
#include "dtensor/dtensor.h"
#include "models/hf/safetensors.h"
#include "models/llama/hf.h"
#include "models/llama/plans.h"
#include "tensor/ops.h"
#include "tests/models/hf_reference.h"
#include "tests/testing/errors.h"
#include "tests/testing/tensor_checks.h"

namespace loom::models {
namespace {

using loom::testing::expect_close;

using loom::testing::RelativeTo;
using loom::testing::Tolerance;

constexpr const char* kCheckpoint = "tests/models/fixtures/hf_llama_tiny.safetensors";
constexpr const char* kConfig = "tests/models/fixtures/hf_llama_tiny_config.json";
constexpr const char* kExpected = "tests/models/fixtures/hf_llama_tiny_logits.json";
constexpr Tolerance kTol{.rtol = 1e-5, .relative_to = RelativeTo::kLargest};

testing::HfReference read_reference() { return testing::read_hf_reference(kExpected); }

TEST(LlamaHFReferenceTest, ConfigJsonIsLlamaTiny) {
  const LlamaConfig config = read_llama_hf_config(kConfig);
  const LlamaConfig tiny = LlamaConfig::preset("llama-tiny");
  EXPECT_EQ(config.dim, tiny.dim);
  EXPECT_EQ(config.n_kv_heads, 2);
  EXPECT_EQ(config.ffn_hidden_dim(), tiny.ffn_hidden_dim());
  EXPECT_EQ(config.parameter_count(), tiny.parameter_count());
  ASSERT_TRUE(config.rope_scaling.has_value());
  EXPECT_EQ(config.rope_scaling->original_max_position_embeddings, 32);
}

TEST(LlamaHFReferenceTest, TransformersCheckpointGivesTransformersLogits) {
  const auto ref = read_reference();
  Llama model(read_llama_hf_config(kConfig), /*seed=*/99);
  load_llama_hf(model, kCheckpoint);
  NoGradGuard no_grad;
  const Tensor logits = model(ref.ids);
  ASSERT_EQ(logits.shape(), ref.logits_shape);
  expect_close({.actual = logits, .expected = ref.logits, .tol = kTol, .what = "logits"});
}

TEST(LlamaHFReferenceTest, TransformersCheckpointOnTensorParallelRanks) {
  const auto ref = read_reference();
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"tp"}, std::vector<int64_t>{2});
    Llama model(read_llama_hf_config(kConfig), /*seed=*/99);
    load_llama_hf(model, kCheckpoint);
    parallelize_llama(model, mesh, {.sequence_parallel = true});
    NoGradGuard no_grad;
    const Tensor logits = full_tensor(model(ref.ids));
    expect_close({.actual = logits, .expected = ref.logits, .tol = kTol, .what = "tp2 logits"});
  });
}

// Export, then import: the same model (every parameter equal), and a config.json that reads back
// to the same config. From tp2 ranks too (the export gathers). transformers reads the file:
// checked by hand with make_hf_llama_fixture.py's environment, not in the suite.
TEST(LlamaHFReferenceTest, ExportReadsBackAsTheSameModel) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/export";
  std::filesystem::create_directories(dir);
  const std::string file = dir + "/model.safetensors";
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"tp"}, std::vector<int64_t>{2});
    Llama model(read_llama_hf_config(kConfig), /*seed=*/99);
    load_llama_hf(model, kCheckpoint);
    parallelize_llama(model, mesh);
    save_llama_hf(model, file, /*write=*/pg.rank() == 0);
  });
  const LlamaConfig config = read_llama_hf_config(dir + "/config.json");
  EXPECT_EQ(config.parameter_count(), LlamaConfig::preset("llama-tiny").parameter_count());
  Llama original(config, 1), exported(config, 2);
  load_llama_hf(original, kCheckpoint);
  load_llama_hf(exported, file);
  const auto want = original.state_dict();
  for (const auto& [name, p] : exported.named_parameters()) {
    EXPECT_EQ(ops::to_vector(p), ops::to_vector(want.at(name))) << name;
  }
}

constexpr const char* kTiedCheckpoint = "tests/models/fixtures/hf_llama_tiny_tied.safetensors";
constexpr const char* kTiedConfig = "tests/models/fixtures/hf_llama_tiny_tied_config.json";
constexpr const char* kTiedExpected = "tests/models/fixtures/hf_llama_tiny_tied_logits.json";

TEST(LlamaHFReferenceTest, TiedCheckpointGivesTransformersLogitsOnOneAndTwoRanks) {
  const auto ref = testing::read_hf_reference(kTiedExpected);
  const LlamaConfig config = read_llama_hf_config(kTiedConfig);
  ASSERT_TRUE(config.tie_word_embeddings);
  EXPECT_EQ(config.parameter_count(),
            LlamaConfig::preset("llama-tiny").parameter_count() - config.vocab_size * config.dim);
  {
    Llama model(config, /*seed=*/99);
    load_llama_hf(model, kTiedCheckpoint);
    EXPECT_EQ(model.state_dict().count("output.weight"), 0u);
    NoGradGuard no_grad;
    expect_close(
        {.actual = model(ref.ids), .expected = ref.logits, .tol = kTol, .what = "tied logits"});
  }
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"tp"}, std::vector<int64_t>{2});
    Llama model(config, /*seed=*/99);
    load_llama_hf(model, kTiedCheckpoint);
    parallelize_llama(model, mesh, {.sequence_parallel = true});
    NoGradGuard no_grad;
    expect_close({.actual = full_tensor(model(ref.ids)),
                  .expected = ref.logits,
                  .tol = kTol,
                  .what = "tied tp2 logits"});
  });
}

TEST(LlamaHFReferenceTest, TiedExportHasNoHeadAndAHeadInTheFileMustEqualTheEmbeddings) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/tied";
  std::filesystem::create_directories(dir);
  const LlamaConfig config = read_llama_hf_config(kTiedConfig);
  Llama model(config, /*seed=*/99);
  load_llama_hf(model, kTiedCheckpoint);
  save_llama_hf(model, dir + "/model.safetensors", /*write=*/true);
  EXPECT_TRUE(read_llama_hf_config(dir + "/config.json").tie_word_embeddings);
  TensorMap file = load_safetensors(dir + "/model.safetensors").tensors;
  EXPECT_EQ(file.count("lm_head.weight"), 0u) << "transformers leaves a tied head out";
  // A file holding the head as well (older exports): equal, it loads; different, it is refused.
  const Tensor embeddings = file.at("model.embed_tokens.weight");
  file["lm_head.weight"] = ops::clone(embeddings);
  save_safetensors(dir + "/with_head.safetensors", file);
  Llama with_head(config, /*seed=*/1);
  load_llama_hf(with_head, dir + "/with_head.safetensors");
  EXPECT_EQ(ops::to_vector(with_head.tok_embeddings->weight()), ops::to_vector(embeddings));
  file["lm_head.weight"] = ops::add(embeddings, 1.0);
  save_safetensors(dir + "/other_head.safetensors", file);
  // Refused before any load too: what a job checks before it starts its ranks.
  {
    DefaultDeviceGuard on_meta(Device::meta());
    const Llama shapes(config, /*seed=*/1);
    EXPECT_THAT(loom::testing::error_of([&] {
                  hf::check(shapes, *llama_hf_adapter(config), dir + "/other_head.safetensors",
                            llama_parameter_names(config), "--init-from");
                }),
                ::testing::HasSubstr("tensor 'lm_head.weight' differs from"));
  }
  Llama other(config, /*seed=*/1);
  EXPECT_THAT(
      loom::testing::error_of([&] { load_llama_hf(other, dir + "/other_head.safetensors"); }),
      ::testing::HasSubstr("tensor 'lm_head.weight' differs from "
                           "'model.embed_tokens.weight': config.json says "
                           "tie_word_embeddings"));
}

// YaRN's RoPE scaling (transformers' rope_type "yarn": frequencies blended by a ramp, cos and sin
// times 1 + 0.1 ln 4) read from config.json, on hf_llama_tiny's weights: transformers' logits
// on 1 rank and tp2, and an export that reads back to the same scaling.
constexpr const char* kYarnConfig = "tests/models/fixtures/hf_llama_tiny_yarn_config.json";
constexpr const char* kYarnExpected = "tests/models/fixtures/hf_llama_tiny_yarn_logits.json";

TEST(LlamaHFReferenceTest, YarnScalingGivesTransformersLogits) {
  const auto ref = testing::read_hf_reference(kYarnExpected);
  const LlamaConfig config = read_llama_hf_config(kYarnConfig);
  ASSERT_TRUE(config.rope_yarn.has_value());
  EXPECT_FALSE(config.rope_scaling.has_value());
  EXPECT_EQ(config.rope_yarn->beta_fast, 16.0);
  EXPECT_EQ(config.rope_yarn->beta_slow, 2.0);
  EXPECT_DOUBLE_EQ(config.rope_yarn->cos_sin_factor(), 1 + 0.1 * std::log(4.0));
  {
    Llama model(config, /*seed=*/99);
    load_llama_hf(model, kCheckpoint);
    NoGradGuard no_grad;
    expect_close(
        {.actual = model(ref.ids), .expected = ref.logits, .tol = kTol, .what = "yarn logits"});
  }
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/yarn";
  std::filesystem::create_directories(dir);
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"tp"}, std::vector<int64_t>{2});
    Llama model(config, /*seed=*/99);
    load_llama_hf(model, kCheckpoint);
    parallelize_llama(model, mesh, {.sequence_parallel = true});
    {
      NoGradGuard no_grad;
      expect_close({.actual = full_tensor(model(ref.ids)),
                    .expected = ref.logits,
                    .tol = kTol,
                    .what = "yarn tp2 logits"});
    }
    save_llama_hf(model, dir + "/model.safetensors", /*write=*/pg.rank() == 0);
  });
  const LlamaConfig read_back = read_llama_hf_config(dir + "/config.json");
  ASSERT_TRUE(read_back.rope_yarn.has_value());
  EXPECT_EQ(read_back.rope_yarn->factor, 4.0);
  EXPECT_EQ(read_back.rope_yarn->beta_fast, 16.0);
  EXPECT_DOUBLE_EQ(read_back.rope_yarn->cos_sin_factor(), config.rope_yarn->cos_sin_factor());
}

}  // namespace
}  // namespace loom::models
