// consolidate_gpt2: a GPT job's distributed checkpoint (saved on any layout) as one Hugging Face
// GPT-2 safetensors file, with the config.json transformers reads beside it.
//
//   bazel run //tools/checkpoint:consolidate_gpt2 -- ckpt/step_00000008 out/model.safetensors
//   bazel run //tools/checkpoint:consolidate_gpt2 -- ckpt out/model.safetensors   # the latest
//
// One process reads the model's entries whole (model/<name>, verified against their checksums)
// into a GPT of the checkpoint's recorded sizes and writes them with save_gpt2_hf: the file
// `loom_train --save` writes at the same step, byte for byte. The optimizer state is left out
// (Hugging Face files hold weights only). Exit 2 on bad arguments, 1 when the checkpoint cannot
// be read.
#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include "base/error.h"
#include "checkpoint/distributed_checkpoint.h"
#include "models/gpt/gpt.h"
#include "models/gpt/hf.h"

namespace {

using namespace loom;

models::GPTConfig model_config(const checkpoint::Metadata& metadata, const std::string& dir) {
  const auto model = metadata.extra.find("model");
  LOOM_CHECK(model != metadata.extra.end(),
             "consolidate_gpt2: '{}' does not record its model config (extra.model); it was not "
             "saved by a GPT job",
             dir);
  LOOM_CHECK(model->value("family", "gpt") == "gpt",
             "consolidate_gpt2: '{}' holds a {} model; this command writes GPT-2 files", dir,
             model->value("family", "gpt"));
  models::GPTConfig config;
  config.n_layer = model->at("n_layer").get<int64_t>();
  config.n_head = model->at("n_head").get<int64_t>();
  config.n_embd = model->at("n_embd").get<int64_t>();
  config.block_size = model->at("block_size").get<int64_t>();
  config.vocab_size = model->at("vocab_size").get<int64_t>();
  config.validate();
  return config;
}

void consolidate(const std::string& input, const std::string& output) {
  const std::string dir = checkpoint::resolve_step_directory(input);
  const checkpoint::Metadata metadata = checkpoint::read_metadata(dir);
  const models::GPTConfig config = model_config(metadata, dir);
  models::GPT model(config, /*seed=*/0);
  checkpoint::StateDict state;
  for (const auto& [name, p] : model.named_parameters())
    state.tensors.emplace_back("model/" + name, p);
  checkpoint::load(state, dir);
  models::save_gpt2_hf(model, output);
  models::write_gpt2_hf_config(config, output);
  fmt::print("consolidate_gpt2: {} (step {}) -> {} and config.json beside it\n", dir, metadata.step,
             output);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"A GPT job's distributed checkpoint as Hugging Face GPT-2 safetensors"};
  std::string input, output;
  app.add_option("checkpoint", input, "a step directory, or a checkpoint directory (its latest)")
      ->required();
  app.add_option("output", output, "the .safetensors file to write")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    consolidate(input, output);
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 1;
  }
  return 0;
}
