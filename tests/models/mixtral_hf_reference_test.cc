// A mixture-of-experts Llama against Hugging Face transformers: a MixtralForCausalLM checkpoint
// written by transformers (tests/models/fixtures/make_hf_mixtral_fixture.py: llama-tiny's
// attention, 4 experts of width 48 in every layer, top-2, one file tensor per expert) loads into
// Loom's Llama with nn::MoE layers — names mapped, the rotary permutation undone, config.json's
// routing read — and gives the logits PyTorch computed, to 1e-5 of their largest magnitude. Also
// when the experts are split over ep = 2 ranks before the load (each rank reads only its
// experts' tensors) and over tp = 2 (each expert's width split), and an export from ep ranks
// reads back as the same model with Mixtral's config.json. Routings Mixtral's format cannot
// hold are refused naming what differs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

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

constexpr const char* kCheckpoint = "tests/models/fixtures/hf_mixtral_tiny.safetensors";
constexpr const char* kConfig = "tests/models/fixtures/hf_mixtral_tiny_config.json";
constexpr const char* kExpected = "tests/models/fixtures/hf_mixtral_tiny_logits.json";
constexpr Tolerance kTol{.rtol = 1e-5, .relative_to = RelativeTo::kLargest};

std::shared_ptr<const DeviceMesh> mesh_of(comm::ProcessGroup& pg, const char* dim) {
  return std::make_shared<const DeviceMesh>(pg.shared_from_this(), std::vector<std::string>{dim},
                                            std::vector<int64_t>{pg.size()});
}

TEST(MixtralHFReferenceTest, ConfigJsonIsAMixtureOfExpertsInEveryLayer) {
  const LlamaConfig config = read_llama_hf_config(kConfig);
  ASSERT_TRUE(config.moe.has_value());
  EXPECT_EQ(config.moe->num_experts, 4);
  EXPECT_EQ(config.moe->top_k, 2);
  EXPECT_EQ(config.moe->hidden_dim, 48);
  EXPECT_EQ(config.moe->score_func, "softmax");
  EXPECT_TRUE(config.moe->route_norm);
  EXPECT_EQ(config.moe->num_shared_experts, 0);
  EXPECT_EQ(config.moe_dense_layers, 0);
  // Training options are the job's: transformers' router_aux_loss_coef is not read.
  EXPECT_EQ(config.moe->aux_loss_coeff, 0.0);
  EXPECT_EQ(config.n_kv_heads, 2);
  EXPECT_EQ(hf_format_gap(config), "");
}

TEST(MixtralHFReferenceTest, TransformersCheckpointGivesTransformersLogits) {
  const auto ref = testing::read_hf_reference(kExpected);
  Llama model(read_llama_hf_config(kConfig), /*seed=*/99);
  load_llama_hf(model, kCheckpoint);
  model.train(false);
  NoGradGuard no_grad;
  const Tensor logits = model(ref.ids);
  ASSERT_EQ(logits.shape(), ref.logits_shape);
  expect_close({.actual = logits, .expected = ref.logits, .tol = kTol, .what = "logits"});
}

TEST(MixtralHFReferenceTest, ExpertParallelRanksReadOnlyTheirExperts) {
  const auto ref = testing::read_hf_reference(kExpected);
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    const auto mesh = mesh_of(pg, "ep");
    Llama model(read_llama_hf_config(kConfig), /*seed=*/99);
    for (const auto& layer : model.layers) parallel::ep::expert_parallel(*layer->moe, mesh);
    const hf::LoadStats stats = load_llama_hf(model, kCheckpoint);
    // Each rank holds 2 of the 4 experts: of the experts' bytes (3 x 4 x 48 x 64 f32 per layer,
    // 2 layers) it reads half.
    const int64_t expert_bytes = 2 * 3 * 4 * 48 * 64 * 4;
    EXPECT_EQ(stats.file_bytes - stats.bytes_read, expert_bytes / 2) << "rank " << pg.rank();
    const Tensor& w1 = model.layers[0]->moe->experts->w1();
    ASSERT_TRUE(is_dtensor(w1));
    EXPECT_EQ(local_shard(w1).size(0), 2);
    model.train(false);
    NoGradGuard no_grad;
    expect_close(
        {.actual = model(ref.ids), .expected = ref.logits, .tol = kTol, .what = "ep2 logits"});
  });
}

TEST(MixtralHFReferenceTest, TensorParallelRanksSplitEachExpert) {
  const auto ref = testing::read_hf_reference(kExpected);
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    Llama model(read_llama_hf_config(kConfig), /*seed=*/99);
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

// Export from ep ranks (the experts gathered), then import: the same parameters, one file
// tensor per expert under Mixtral's names, and Mixtral's config.json reading back to the config.
TEST(MixtralHFReferenceTest, ExportFromExpertParallelRanksReadsBackAsTheSameModel) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/export";
  std::filesystem::create_directories(dir);
  const std::string file = dir + "/model.safetensors";
  LlamaConfig config = read_llama_hf_config(kConfig);
  config.moe->aux_loss_coeff = 0.01;
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    Llama model(config, /*seed=*/99);
    load_llama_hf(model, kCheckpoint);
    for (const auto& layer : model.layers)
      parallel::ep::expert_parallel(*layer->moe, mesh_of(pg, "ep"));
    save_llama_hf(model, file, /*write=*/pg.rank() == 0);
  });
  const hf::ConfigJson json = hf::ConfigJson::read(dir + "/config.json");
  EXPECT_EQ(json.string_or("model_type", ""), "mixtral");
  EXPECT_EQ(json.positive_int("num_local_experts"), 4);
  EXPECT_EQ(json.positive_int("intermediate_size"), 48);
  // transformers' loss counts each of the top-k slots, and pools the layers into one term:
  // Loom's coefficient times the layers over top_k.
  EXPECT_DOUBLE_EQ(json.number("router_aux_loss_coef"), 0.01);
  const TensorMap tensors = load_safetensors(file).tensors;
  EXPECT_EQ(tensors.at("model.layers.1.block_sparse_moe.experts.3.w2.weight").shape(),
            (Shape{64, 48}));
  EXPECT_EQ(tensors.count("model.layers.0.block_sparse_moe.gate.weight"), 1u);
  EXPECT_EQ(tensors.size(), load_safetensors(kCheckpoint).tensors.size());
  const LlamaConfig read_back = read_llama_hf_config(dir + "/config.json");
  EXPECT_EQ(read_back.parameter_count(), config.parameter_count());
  Llama original(read_back, 1), exported(read_back, 2);
  load_llama_hf(original, kCheckpoint);
  load_llama_hf(exported, file);
  const auto want = original.state_dict();
  for (const auto& [name, p] : exported.named_parameters()) {
    EXPECT_EQ(ops::to_vector(p), ops::to_vector(want.at(name))) << name;
  }
}

TEST(MixtralHFReferenceTest, RoutingsMixtralCannotHoldAreNamed) {
  LlamaConfig config = read_llama_hf_config(kConfig);
  config.moe->score_func = "sigmoid";
  EXPECT_THAT(hf_format_gap(config), ::testing::HasSubstr("sigmoid router scores"));
  config = read_llama_hf_config(kConfig);
  config.moe->route_norm = false;
  EXPECT_THAT(hf_format_gap(config), ::testing::HasSubstr("--moe-route-norm 1"));
  config = read_llama_hf_config(kConfig);
  config.moe->num_shared_experts = 1;
  EXPECT_THAT(hf_format_gap(config), ::testing::HasSubstr("1 shared experts"));
  config = read_llama_hf_config(kConfig);
  config.moe_dense_layers = 1;
  EXPECT_THAT(hf_format_gap(config), ::testing::HasSubstr("first 1 layers"));
  config = read_llama_hf_config(kConfig);
  config.moe->bias_update_rate = 0.001;
  EXPECT_THAT(hf_format_gap(config), ::testing::HasSubstr("expert bias"));
}

TEST(MixtralHFReferenceTest, ASlidingWindowShorterThanTheContextIsRefused) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/window";
  std::filesystem::create_directories(dir);
  nlohmann::json json = hf::ConfigJson::read(kConfig).json();
  json["sliding_window"] = 64;
  const std::string path = dir + "/config.json";
  std::ofstream(path) << json.dump();
  EXPECT_THAT(loom::testing::error_of([&] { read_llama_hf_config(path); }),
              ::testing::HasSubstr("\"sliding_window\" = 64: Loom's attention sees every earlier "
                                   "position"));
  json["sliding_window"] = 128;
  std::ofstream(path) << json.dump();
  EXPECT_TRUE(read_llama_hf_config(path).moe.has_value());
}

}  // namespace
}  // namespace loom::models
