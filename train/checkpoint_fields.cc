#include "train/checkpoint_fields.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "checkpoint/sha256.h"

namespace loom::train {

namespace {

// The data's fingerprint: SHA-256 of its tokens as int32 (so the same tokens in one file or in
// many shards, of either width, are the same data); a corpus of more than 64M tokens hashes 4096
// evenly spaced runs of 4096 tokens and its size instead of reading all of it.
std::string data_sha256(const data::TokenCorpus& data) {
  constexpr int64_t kWhole = int64_t{1} << 26, kRuns = 4096, kRun = 4096, kChunk = 1 << 16;
  checkpoint::Sha256 hash;
  std::vector<int64_t> wide;
  std::vector<int32_t> tokens;
  // Streamed a chunk at a time: memory stays the same whatever the corpus's size.
  const auto take = [&](int64_t start, int64_t count) {
    for (int64_t at = start; at < start + count; at += kChunk) {
      const int64_t n = std::min(kChunk, start + count - at);
      wide.resize(static_cast<size_t>(n));
      data.read(at, n, wide.data());
      tokens.assign(wide.begin(), wide.end());
      hash.update(tokens.data(), tokens.size() * sizeof(tokens[0]));
    }
  };
  if (data.size() <= kWhole) {
    take(0, data.size());
  } else {
    for (int64_t r = 0; r < kRuns; ++r) take((data.size() - kRun) / (kRuns - 1) * r, kRun);
    const int32_t size[2] = {static_cast<int32_t>(data.size() >> 32),
                             static_cast<int32_t>(data.size())};
    hash.update(size, sizeof(size));
  }
  return hash.hex();
}

}  // namespace

nlohmann::json run_fields(const JobConfig& job, const data::TokenCorpus& data) {
  return {{"data",
           {{"tokens", data.size()},
            {"vocab_size", data.vocab_size()},
            {"sha256", data_sha256(data)},
            {"path", job.data}}},
          {"seed", job.seed},
          {"batch_size", job.batch_size},
          {"seq_len", job.seq_len},
          {"document_boundaries", job.document_boundaries},
          {"document_token", job.document_token},
          {"steps", job.steps},
          {"lr", job.lr},
          {"clip", job.clip},
          {"mixed_precision", job.mixed_precision},
          {"dropout", job.dropout},
          {"attn_dropout", job.attn_dropout}};
}

nlohmann::json job_checkpoint_fields(const nlohmann::json& model, const DeviceMesh& mesh,
                                     const nlohmann::json& run,
                                     const nlohmann::json& hf_token_settings,
                                     const SavedLoss& last) {
  nlohmann::json fields = {{"model", model},
                           {"layout", mesh.str()},
                           {"run", run},
                           {"metrics", {{"step", last.step}, {"loss", last.loss}}}};
  if (hf_token_settings.is_object() && !hf_token_settings.empty()) {
    fields["hf"] = hf_token_settings;
  }
  return fields;
}

std::optional<SavedLoss> saved_loss(const checkpoint::Metadata& metadata) {
  const auto it = metadata.extra.find("metrics");
  if (it == metadata.extra.end() || !it->is_object()) return std::nullopt;
  const auto step = it->find("step"), loss = it->find("loss");
  if (step == it->end() || !step->is_number_integer() || loss == it->end() || !loss->is_number()) {
    return std::nullopt;
  }
  return SavedLoss{step->get<int64_t>(), loss->get<double>()};
}

nlohmann::json without_training_fields(nlohmann::json fields,
                                       const std::vector<models::TrainingField>& training) {
  for (const models::TrainingField& field : training) {
    const nlohmann::json::json_pointer pointer(field.pointer);
    if (fields.contains(pointer)) fields.at(pointer.parent_pointer()).erase(pointer.back());
  }
  return fields;
}

std::vector<std::string> check_same_model(const checkpoint::Metadata& metadata,
                                          const nlohmann::json& model, const std::string& directory,
                                          const std::vector<models::TrainingField>& training) {
  const auto recorded = metadata.extra.find("model");
  LOOM_CHECK(recorded != metadata.extra.end() && recorded->is_object(),
             "checkpoint '{}' does not record its model config; it was not saved by a Loom job",
             directory);
  // A training setting is a warning when both record it and it differ; then, as one only one
  // side records (a later Loom's), it is left out of the comparison.
  std::vector<std::string> warnings;
  for (const models::TrainingField& field : training) {
    const nlohmann::json::json_pointer pointer(field.pointer);
    if (recorded->contains(pointer) && model.contains(pointer) &&
        recorded->at(pointer) != model.at(pointer)) {
      warnings.push_back(fmt::format(
          "WARNING: checkpoint '{}' trained with {} {}; this run goes on with {} {} (a training "
          "setting: the steps from here differ from the saved run's)",
          directory, field.flag, recorded->at(pointer).dump(), field.flag,
          model.at(pointer).dump()));
    }
  }
  const nlohmann::json saved = without_training_fields(*recorded, training);
  const nlohmann::json here = without_training_fields(model, training);
  // A field this model has that the checkpoint lacks was recorded only by later Looms (a GPT's
  // "family", a Llama's RoPE settings): not compared. A field the checkpoint has that this model
  // lacks is another model; so is having no field in common.
  std::vector<std::string> differences;
  size_t common = 0;
  for (const auto& [key, value] : here.items()) {
    const auto there = saved.find(key);
    if (there == saved.end()) continue;
    ++common;
    if (*there != value) {
      differences.push_back(fmt::format("{} {} there, {} here", key, there->dump(), value.dump()));
    }
  }
  for (const auto& [key, value] : saved.items()) {
    if (!here.contains(key)) {
      differences.push_back(fmt::format("{} {} there, none here", key, value.dump()));
    }
  }
  if (common == 0 && differences.empty()) differences.push_back("no model field in common");
  LOOM_CHECK(differences.empty(),
             "checkpoint '{}' was saved from another model config: {}; give the same model "
             "flags (or --config the run's effective config)",
             directory, fmt::join(differences, ", "));
  return warnings;
}

namespace {

// The command-line flag of a run field: "seq_len" -> "--seq-len".
std::string flag_of(std::string_view key) {
  std::string flag = fmt::format("--{}", key);
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

}  // namespace

std::vector<std::string> check_same_run(const checkpoint::Metadata& metadata,
                                        const nlohmann::json& here, const std::string& directory) {
  const auto saved = metadata.extra.find("run");
  if (saved == metadata.extra.end() || !saved->is_object()) {
    return {fmt::format(
        "WARNING: checkpoint '{}' does not record its run (data, seed, batch: saved by an "
        "older Loom); they are not checked",
        directory)};
  }
  const auto value_of = [](const nlohmann::json& json, const std::string& key) {
    return json.contains(key) ? json.at(key).dump() : std::string("none");
  };
  std::vector<std::string> refused;
  const nlohmann::json& data_there = saved->value("data", nlohmann::json::object());
  const nlohmann::json& data_here = here.at("data");
  if (value_of(data_there, "sha256") != value_of(data_here, "sha256")) {
    refused.push_back(fmt::format(
        "--data: other data ({} tokens of {} there, {} tokens of {} here; their SHA-256 differ)",
        value_of(data_there, "tokens"), value_of(data_there, "path"), value_of(data_here, "tokens"),
        value_of(data_here, "path")));
  }
  // Each decides the batches. A checkpoint of a Loom that did not record the document settings
  // is not refused for them.
  for (const char* key : kRunBatchKeys) {
    const bool recorded = saved->contains(key) || std::string_view(key).rfind("document", 0) != 0;
    if (recorded && value_of(*saved, key) != value_of(here, key)) {
      const std::string flag = flag_of(key);
      refused.push_back(
          fmt::format("{} {} there, {} here", flag, value_of(*saved, key), value_of(here, key)));
    }
  }
  LOOM_CHECK(refused.empty(),
             "--resume: checkpoint '{}' was saved by another run: {}. Continuing would train on "
             "other batches than that run's next ones; give the run's settings (--config its "
             "effective config), or start a new --checkpoint-dir (--init-from takes its weights "
             "once //tools/checkpoint:consolidate wrote them as a Hugging Face file)",
             directory, fmt::join(refused, "; "));
  std::vector<std::string> warnings;
  for (const char* key : {"steps", "lr"}) {
    if (value_of(*saved, key) != value_of(here, key)) {
      warnings.push_back(
          fmt::format("WARNING: --resume: --{} {} here, {} in the saved run: the learning-rate "
                      "schedule changes from the saved step on",
                      key, value_of(here, key), value_of(*saved, key)));
    }
  }
  // Settings a run may change on purpose, which make it train otherwise from the saved step on
  // (no longer the saved run's continuation bit for bit). Compared when the checkpoint records
  // them (older Looms did not).
  for (const char* key : kRunTrainingKeys) {
    if (saved->contains(key) && value_of(*saved, key) != value_of(here, key)) {
      warnings.push_back(fmt::format(
          "WARNING: --resume: {} {} here, {} in the saved run: the run trains with it from the "
          "saved step on",
          flag_of(key), value_of(here, key), value_of(*saved, key)));
    }
  }
  return warnings;
}

std::string saved_layout(const checkpoint::Metadata& metadata) {
  const auto layout = metadata.extra.find("layout");
  return layout != metadata.extra.end() && layout->is_string() ? layout->get<std::string>() : "";
}

std::unique_ptr<models::ModelArgs> saved_model(const checkpoint::Metadata& metadata,
                                               const std::string& directory,
                                               std::string_view what) {
  const auto fields = metadata.extra.find("model");
  LOOM_CHECK(fields != metadata.extra.end(),
             "{}{}checkpoint '{}' does not record its model (extra.model): it was not saved by a "
             "Loom job, or its metadata was edited",
             what, what.empty() ? "" : ": ", directory);
  const std::string where = fmt::format("checkpoint '{}'", directory);
  return models::family_of_fields(*fields, where).from_fields(*fields, where);
}

}  // namespace loom::train
