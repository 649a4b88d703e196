// consolidate: a job's distributed checkpoint (any registered family, saved on any layout) as
// one Hugging Face safetensors file, with the config.json transformers reads beside it.
//
//   bazel run //tools/checkpoint:consolidate -- ckpt/step_00000008 out/model.safetensors
//   bazel run //tools/checkpoint:consolidate -- ckpt out/model.safetensors   # the latest
//
// One process rebuilds the model from the fields the checkpoint recorded (its family and sizes,
// models::ModelFamily::from_fields), reads the model's entries whole (model/<name>, verified
// against their checksums) and writes them through the family's Hugging Face adapter: the file
// `loom_train --save` writes at the same step, byte for byte. The optimizer state is left out
// (Hugging Face files hold weights only). Exit 2 on bad arguments, 1 when the checkpoint cannot
// be read or its family has no Hugging Face format.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <exception>

#include "autograd/grad_mode.h"
#include "base/bazel_run.h"
#include "base/error.h"
#include "checkpoint/distributed_checkpoint.h"
#include "models/family.h"
#include "models/hf/checkpoint.h"
#include "models/hf/token_settings.h"
#include "nn/moe/moe.h"
#include "train/checkpoint_fields.h"
#include "train/trainer.h"

namespace {

using namespace loom;

void consolidate(const std::string& input, const std::string& output,
                 const std::string& tokenizer) {
  const std::string dir = checkpoint::resolve_step_directory(input);
  // Given the checkpoint folder: what its latest committed step passed over, as verify_checkpoint
  // says it (a save that did not commit).
  if (!checkpoint::is_step_directory(input)) {
    const std::vector<std::string> uncommitted = checkpoint::uncommitted_step_directories(input);
    if (!uncommitted.empty()) {
      fmt::print(stderr,
                 "consolidate: note: '{}' also holds {} step folder(s) no save committed ({}): "
                 "consolidating the latest committed step, {}\n",
                 input, uncommitted.size(), fmt::join(uncommitted, ", "), dir);
    }
  }
  const checkpoint::Metadata metadata = checkpoint::read_metadata(dir);
  const std::unique_ptr<models::ModelArgs> args = train::saved_model(metadata, dir, "");
  const auto adapter = args->hf_adapter();
  LOOM_CHECK(adapter != nullptr, "checkpoint '{}': {}", dir, args->no_hf_format());
  const std::shared_ptr<nn::Module> model = args->whole_model();
  checkpoint::StateDict state;
  for (const auto& [name, p] : model->named_parameters()) {
    state.tensors.emplace_back("model/" + name, p);
  }
  // The routing biases of a mixture of experts: part of the model (DeepSeek-V3's file holds them).
  for (const auto& [name, module] : model->named_modules()) {
    if (const auto* moe = dynamic_cast<const nn::MoE*>(module)) {
      state.tensors.emplace_back(train::Trainer::expert_bias_key(name), moe->expert_bias());
    }
  }
  checkpoint::load(state, dir);
  models::hf::save(models::hf::whole_parameters(*model, *adapter), *adapter, output);
  // The token ids and generation config the job kept from the checkpoint it started from.
  const auto hf = metadata.extra.find("hf");
  const bool generation = hf != metadata.extra.end() && hf->contains("generation_config");
  if (hf != metadata.extra.end()) models::hf::write_token_settings(*hf, output);
  if (!tokenizer.empty()) models::hf::copy_tokenizer_beside(tokenizer, output);
  fmt::print("consolidate: {} (step {}) -> {} and config.json{}{} beside it; {}\n", dir,
             metadata.step, output, generation ? ", generation_config.json" : "",
             tokenizer.empty() ? "" : ", tokenizer.json", args->summary());
}

}  // namespace

int main(int argc, char** argv) {
  // First: CLI11's ExistingFile checks --tokenizer's path where bazel run was started.
  try {
    loom::enter_bazel_working_directory();
  } catch (const std::exception& error) {
    fmt::print(stderr, "consolidate: {}\n", error.what());
    return 2;
  }
  CLI::App app{
      "A job's distributed checkpoint as Hugging Face safetensors (GPT-2, Llama, Mixtral: the "
      "family "
      "the checkpoint recorded)"};
  std::string input, output;
  app.add_option("checkpoint", input, "a step directory, or a checkpoint directory (its latest)")
      ->required();
  app.add_option("output", output, "the .safetensors file to write")->required();
  std::string tokenizer;
  app.add_option("--tokenizer", tokenizer,
                 "a tokenizer.json to copy beside it (the job's --save copies the one it used; "
                 "a checkpoint does not hold it)")
      ->check(CLI::ExistingFile);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help 0; a bad command line 2, not CLI11's own codes
  }
  try {
    // A bad output is bad input (exit 2), named before the checkpoint is read.
    loom::models::hf::check_save_path(output, "output");
  } catch (const std::exception& error) {
    fmt::print(stderr, "consolidate: {}\n", error.what());
    return 2;
  }
  try {
    consolidate(input, output, tokenizer);
    return 0;
  } catch (const std::exception& error) {
    fmt::print(stderr, "consolidate: {}\n", error.what());
    return 1;
  }
}
