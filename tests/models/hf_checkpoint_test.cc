// Hugging Face checkpoints through models/hf/checkpoint.h, for both families:
//   - config.json errors name the file and the key (missing, wrong type, nested keys), and
//     features Loom does not compute are refused by key, never loaded as another model;
//   - a tensor no parameter takes is refused; a sharded checkpoint (index + shards) and a
//     checkpoint folder load as the single file does;
//   - loads into sharded layouts: tp 2 (Llama's GQA heads), FSDP over 2, and both nested
//     (tp 2 x dp_shard 2: FSDP re-shards each tp shard), every rank's shard equal bit for bit to
//     the same box of the one-rank model (the loader copies the box of each placement).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "comm/testing/multi_rank.h"
#include "dtensor/dtensor.h"
#include "models/gpt/hf.h"
#include "models/gpt/plans.h"
#include "models/hf/checkpoint.h"
#include "models/llama/hf.h"
#include "models/llama/plans.h"
#include "parallel/fsdp/fully_shard.h"
#include "tensor/ops.h"
#include "tests/testing/errors.h"

namespace loom::models {
namespace {

using loom::testing::error_of;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr const char* kLlamaCheckpoint = "tests/models/fixtures/hf_llama_tiny.safetensors";
constexpr const char* kLlamaConfig = "tests/models/fixtures/hf_llama_tiny_config.json";

std::string temp_dir(const std::string& name) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  std::filesystem::create_directories(dir);
  return dir;
}

nlohmann::json llama_config_json() {
  std::ifstream in(kLlamaConfig);
  return nlohmann::json::parse(in);
}

// The Llama config read from `json` written to a file; returns the error's message.
std::string llama_config_error(const nlohmann::json& json, const std::string& name) {
  const std::string path = temp_dir(name) + "/config.json";
  std::ofstream(path) << json.dump();
  return error_of([&] { read_llama_hf_config(path); });
}

TEST(HFConfigTest, MissingAndMistypedKeysNameTheFileAndTheKey) {
  nlohmann::json json = llama_config_json();
  json["hidden_size"] = "64";
  EXPECT_THAT(llama_config_error(json, "type"),
              AllOf(HasSubstr("type/config.json"),
                    HasSubstr("\"hidden_size\" must be a positive integer, got \"64\"")));
  json = llama_config_json();
  json["rope_parameters"].erase("factor");
  EXPECT_THAT(
      llama_config_error(json, "nested"),
      AllOf(HasSubstr("nested/config.json"), HasSubstr("\"rope_parameters\" has no \"factor\"")));
  json = llama_config_json();
  json.erase("num_hidden_layers");
  EXPECT_THAT(llama_config_error(json, "missing"), HasSubstr("has no \"num_hidden_layers\""));
  json = llama_config_json();
  json["rms_norm_eps"] = true;
  EXPECT_THAT(llama_config_error(json, "eps"),
              HasSubstr("\"rms_norm_eps\" must be a number, got true"));
  const std::string path = temp_dir("bad") + "/config.json";
  std::ofstream(path) << "{\"hidden_size\": 64,";
  EXPECT_THAT(error_of([&] { read_llama_hf_config(path); }),
              AllOf(HasSubstr(path), HasSubstr("is not valid JSON")));
}

TEST(HFConfigTest, FeaturesLoomDoesNotComputeAreRefusedByKey) {
  const std::vector<std::pair<std::string, nlohmann::json>> refused = {
      {"attention_bias", true},      {"mlp_bias", true},
      {"hidden_act", "gelu"},        {"head_dim", 32},
      {"model_type", "mistral"},     {"quantization_config", {{"quant_method", "fp8"}}},
      {"partial_rotary_factor", 0.5}};
  for (const auto& [key, value] : refused) {
    nlohmann::json json = llama_config_json();
    json[key] = value;
    EXPECT_THAT(llama_config_error(json, key),
                AllOf(HasSubstr("config.json"), HasSubstr("\"" + key + "\" = " + value.dump())))
        << key;
  }
  nlohmann::json json = llama_config_json();
  json["rope_parameters"]["rope_type"] = "longrope";
  EXPECT_THAT(llama_config_error(json, "longrope"),
              HasSubstr("\"rope_type\" = \"longrope\": Loom implements the default RoPE, Llama "
                        "3's (\"llama3\") and YaRN's (\"yarn\"), not \"longrope\""));
  // The same keys at Loom's values are fine (transformers writes them); attention_dropout is a
  // training option (--attn-dropout), not read, as GPT-2's pdrops.
  json = llama_config_json();
  json["head_dim"] = 16;
  json["attention_bias"] = false;
  json["attention_dropout"] = 0.1;
  const std::string path = temp_dir("fine") + "/config.json";
  std::ofstream(path) << json.dump();
  EXPECT_EQ(read_llama_hf_config(path).head_dim(), 16);
  EXPECT_EQ(read_llama_hf_config(path).attention_dropout, 0.0);
  EXPECT_FALSE(read_llama_hf_config(path).tie_word_embeddings);
  // A tied head (Llama 3.2's small models) is read, not refused.
  json["tie_word_embeddings"] = true;
  std::ofstream(path) << json.dump();
  EXPECT_TRUE(read_llama_hf_config(path).tie_word_embeddings);
}

// config.json records the dropout a model trained with (transformers' GPT-2 defaults its pdrops
// to 0.1 when they are absent); reading it back takes none (the job's option decides).
TEST(HFConfigTest, ConfigJsonRecordsTheTrainingsDropout) {
  const nlohmann::json gpt = gpt2_hf_adapter(GPTConfig{.n_layer = 1,
                                                       .n_head = 2,
                                                       .n_embd = 16,
                                                       .block_size = 8,
                                                       .vocab_size = 11,
                                                       .dropout = 0.1,
                                                       .attn_dropout = 0.2})
                                 ->config_json();
  EXPECT_EQ(gpt.at("resid_pdrop"), 0.1);
  EXPECT_EQ(gpt.at("embd_pdrop"), 0.1);
  EXPECT_EQ(gpt.at("attn_pdrop"), 0.2);
  EXPECT_EQ(gpt2_hf_adapter(GPTConfig{})->config_json().at("attn_pdrop"), 0.0);
  LlamaConfig llama = LlamaConfig::preset("llama-tiny");
  llama.attention_dropout = 0.1;
  EXPECT_EQ(llama_hf_adapter(llama)->config_json().at("attention_dropout"), 0.1);
  const std::string dir = temp_dir("pdrops");
  write_gpt2_hf_config(GPTConfig{.n_layer = 1,
                                 .n_head = 2,
                                 .n_embd = 16,
                                 .block_size = 8,
                                 .vocab_size = 11,
                                 .dropout = 0.1},
                       dir + "/model.safetensors");
  EXPECT_EQ(read_gpt2_hf_config(dir + "/model.safetensors")->dropout, 0.0);
}

TEST(HFConfigTest, GPT2ConfigRefusesWhatItCannotCompute) {
  const std::string dir = temp_dir("gpt2");
  const GPTConfig tiny{.n_layer = 2, .n_head = 2, .n_embd = 16, .block_size = 8, .vocab_size = 11};
  write_gpt2_hf_config(tiny, dir + "/model.safetensors");
  ASSERT_EQ(read_gpt2_hf_config(dir + "/model.safetensors")->n_embd, 16);
  std::ifstream in(dir + "/config.json");
  const nlohmann::json written = nlohmann::json::parse(in);
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"activation_function", "relu"},
           {"n_inner", 32},
           {"scale_attn_by_inverse_layer_idx", true},
           {"n_embd", "16"}}) {
    nlohmann::json json = written;
    json[key] = value;
    std::ofstream(dir + "/config.json") << json.dump();
    EXPECT_THAT(error_of([&] { read_gpt2_hf_config(dir + "/model.safetensors"); }),
                AllOf(HasSubstr(dir + "/config.json"), HasSubstr("\"" + key + "\"")))
        << key;
  }
}

TEST(HFCheckpointTest, ATensorNoParameterTakesIsRefused) {
  TensorMap file = load_safetensors(kLlamaCheckpoint).tensors;
  file.emplace("model.layers.0.self_attn.q_proj.bias", ops::zeros({64}));
  const std::string path = temp_dir("extra") + "/model.safetensors";
  save_safetensors(path, file);
  Llama model(read_llama_hf_config(kLlamaConfig), 1);
  const auto before = ops::to_vector(model.named_parameters().front().second);
  EXPECT_THAT(error_of([&] { load_llama_hf(model, path); }),
              AllOf(HasSubstr("unexpected tensor 'model.layers.0.self_attn.q_proj.bias'"),
                    HasSubstr("the model is unchanged")));
  EXPECT_EQ(ops::to_vector(model.named_parameters().front().second), before);
}

TEST(HFCheckpointTest, ShardedIndexAndFolderLoadAsTheSingleFile) {
  const TensorMap whole = load_safetensors(kLlamaCheckpoint).tensors;
  const std::string dir = temp_dir("sharded");
  TensorMap first, second;
  nlohmann::json weight_map;
  for (const auto& [name, tensor] : whole) {
    const bool in_first = first.size() < whole.size() / 2;
    (in_first ? first : second).emplace(name, tensor);
    weight_map[name] =
        in_first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  save_safetensors(dir + "/model-00001-of-00002.safetensors", first);
  save_safetensors(dir + "/model-00002-of-00002.safetensors", second);
  std::ofstream(dir + "/model.safetensors.index.json")
      << nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump();
  std::filesystem::copy_file(kLlamaConfig, dir + "/config.json");

  const LlamaConfig config = read_llama_hf_config(hf::config_json_path(dir));
  Llama single(config, 1), indexed(config, 2), folder(config, 3);
  load_llama_hf(single, kLlamaCheckpoint);
  load_llama_hf(indexed, dir + "/model.safetensors.index.json");
  load_llama_hf(folder, dir);
  const auto want = single.state_dict();
  for (const auto& [name, p] : indexed.named_parameters()) {
    EXPECT_EQ(ops::to_vector(p), ops::to_vector(want.at(name))) << name;
  }
  for (const auto& [name, p] : folder.named_parameters()) {
    EXPECT_EQ(ops::to_vector(p), ops::to_vector(want.at(name))) << name;
  }
  weight_map.begin().value() = "missing.safetensors";
  std::ofstream(dir + "/model.safetensors.index.json")
      << nlohmann::json{{"weight_map", weight_map}}.dump();
  EXPECT_THAT(error_of([&] { load_llama_hf(indexed, dir + "/model.safetensors.index.json"); }),
              HasSubstr("names the shard"));
}

// Every rank's shard of every parameter equals the same box of the one-rank model, loaded from
// the same file.
void expect_shards_equal_one_rank(const nn::Module& sharded, const nn::Module& whole) {
  const auto want = whole.state_dict();
  for (const auto& [name, p] : sharded.named_parameters()) {
    ASSERT_TRUE(want.count(name)) << name;
    Tensor expected = want.at(name);
    Tensor actual = p;
    if (is_dtensor(p)) {
      const DTensorSpec& spec = dtensor_spec(p, "test");
      const Shape offset = spec.local_offset(), local = spec.local_shape();
      for (int64_t d = 0; d < expected.dim(); ++d) {
        expected = ops::narrow(expected, d, offset[d], local[d]);
      }
      actual = local_shard(p);
    }
    EXPECT_EQ(ops::to_vector(actual), ops::to_vector(ops::contiguous(expected))) << name;
  }
}

TEST(HFCheckpointTest, LlamaLoadsIntoTensorParallelAndFullyShardedLayouts) {
  const LlamaConfig config = read_llama_hf_config(kLlamaConfig);
  Llama reference(config, 1);
  load_llama_hf(reference, kLlamaCheckpoint);
  // {dp_shard, tp} on 4 ranks: tp only, FSDP only, and FSDP over tp shards.
  for (const auto& [dp_shard, tp] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 2}, {2, 1}, {2, 2}}) {
    SCOPED_TRACE(fmt::format("dp_shard {} x tp {}", dp_shard, tp));
    comm::testing::run_on_ranks(static_cast<int>(dp_shard * tp), [&](comm::ProcessGroup& pg) {
      const auto mesh = std::make_shared<const DeviceMesh>(
          pg.shared_from_this(), std::vector<std::string>{"dp_shard", "tp"},
          std::vector<int64_t>{dp_shard, tp});
      Llama model(config, /*seed=*/7);
      if (tp > 1) parallelize_llama(model, std::make_shared<const DeviceMesh>((*mesh)["tp"]));
      if (dp_shard > 1) {
        const auto dp_mesh = std::make_shared<const DeviceMesh>((*mesh)["dp_shard"]);
        for (auto& layer : model.layers) fsdp::fully_shard(*layer, dp_mesh);
        fsdp::fully_shard(model, dp_mesh);
      }
      load_llama_hf(model, kLlamaCheckpoint);
      expect_shards_equal_one_rank(model, reference);
    });
  }
}

// `model` sharded on 4 ranks: FSDP over dp_shard (every block, then the root) after the TP plan.
template <typename Model>
void shard(Model& model, const std::shared_ptr<const DeviceMesh>& mesh, int64_t dp_shard,
           int64_t tp, const std::function<void(Model&, std::shared_ptr<const DeviceMesh>)>& plan,
           const std::vector<nn::Module*>& blocks) {
  if (tp > 1) plan(model, std::make_shared<const DeviceMesh>((*mesh)["tp"]));
  if (dp_shard > 1) {
    const auto dp_mesh = std::make_shared<const DeviceMesh>((*mesh)["dp_shard"]);
    for (nn::Module* block : blocks) fsdp::fully_shard(*block, dp_mesh);
    fsdp::fully_shard(model, dp_mesh);
  }
}

// A sharded load reads each rank's boxes alone (StateDictAdapter::file_layout, hf/file_boxes.h):
// on 4 ranks each reads about a quarter of the file's bytes, and its shards equal the one-rank
// model's bit for bit. Llama: the rotary row permutation of wq and wk; GPT-2: Conv1D's
// transposes, c_attn's head-major rows, and the lm_head = wte check made on each rank's box.
TEST(HFCheckpointTest, ShardedLoadsReadAboutAQuarterOfTheFileEach) {
  const std::vector<std::pair<int64_t, int64_t>> layouts = {{4, 1}, {2, 2}};  // {dp_shard, tp}
  const LlamaConfig llama_config = read_llama_hf_config(kLlamaConfig);
  Llama llama_reference(llama_config, 1);
  load_llama_hf(llama_reference, kLlamaCheckpoint);
  const GPTConfig gpt_config{
      .n_layer = 2, .n_head = 4, .n_embd = 32, .block_size = 16, .vocab_size = 67};
  const std::string gpt_path = temp_dir("sharded_reads") + "/gpt2.safetensors";
  GPT gpt_reference(gpt_config, 5);
  save_gpt2_hf(gpt_reference, gpt_path);
  for (const auto& [dp_shard, tp] : layouts) {
    SCOPED_TRACE(fmt::format("dp_shard {} x tp {}", dp_shard, tp));
    for (const bool is_llama : {true, false}) {
      const std::string path = is_llama ? std::string(kLlamaCheckpoint) : gpt_path;
      comm::testing::run_on_ranks(4, [&](comm::ProcessGroup& pg) {
        const auto mesh = std::make_shared<const DeviceMesh>(
            pg.shared_from_this(), std::vector<std::string>{"dp_shard", "tp"},
            std::vector<int64_t>{dp_shard, tp});
        hf::LoadStats stats;
        if (is_llama) {
          Llama model(llama_config, /*seed=*/7);
          std::vector<nn::Module*> blocks;
          for (auto& layer : model.layers) blocks.push_back(layer.get());
          shard<Llama>(
              model, mesh, dp_shard, tp,
              [](Llama& m, auto tp_mesh) { parallelize_llama(m, tp_mesh); }, blocks);
          stats = load_llama_hf(model, path);
          expect_shards_equal_one_rank(model, llama_reference);
        } else {
          GPT model(gpt_config, /*seed=*/7);
          std::vector<nn::Module*> blocks;
          for (auto& block : model.h) blocks.push_back(block.get());
          shard<GPT>(
              model, mesh, dp_shard, tp, [](GPT& m, auto tp_mesh) { parallelize_gpt(m, tp_mesh); },
              blocks);
          stats = load_gpt2_hf(model, path);
          expect_shards_equal_one_rank(model, gpt_reference);
        }
        // Uneven rows (a vocabulary of 67 over 4 ranks) move a rank's share by a few per cent
        // (measured 0.991-1.034); a whole read would be 4x.
        const double share = 4.0 * static_cast<double>(stats.bytes_read) / stats.file_bytes;
        EXPECT_GT(share, 0.95) << "rank " << pg.rank() << " read " << stats.bytes_read;
        EXPECT_LT(share, 1.05) << "rank " << pg.rank() << " read " << stats.bytes_read;
      });
    }
  }
}

}  // namespace
}  // namespace loom::models
