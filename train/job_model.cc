#include "train/job_model.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>

#include "base/error.h"
#include "models/hf/checkpoint.h"
#include "train/parallel_model.h"

namespace loom::train {

JobModel resolve_job_model(const JobConfig& job) {
  JobModel out;
  out.family = &models::family_of_model(job.model);
  const models::ModelSizes sizes = job.sizes();
  models::refuse_dropout(sizes, *out.family);
  std::string context_from = job.block_size ? "--block-size" : "--block-size, the preset's";
  std::error_code ec;
  const std::string config_json =
      job.init_from.empty() ? "" : models::hf::config_json_path(job.init_from);
  if (!config_json.empty() && std::filesystem::exists(config_json, ec)) {
    const models::hf::ConfigJson json = models::hf::ConfigJson::read(config_json);
    const std::string type = json.string_or("model_type", "");
    const std::vector<std::string> reads = out.family->hf_model_types();
    if (!type.empty() && !reads.empty() &&
        std::find(reads.begin(), reads.end(), type) == reads.end()) {
      const models::ModelFamily& other =
          models::family_of_hf_model_type(type, fmt::format("--init-from: {}", json.where()));
      LOOM_FAIL(
          "--model {}: the {} family reads model_type \"{}\", but --init-from's {} is \"{}\", "
          "the {} family's; leave --model out (the file's family is taken) or name one of its "
          "presets ({})",
          job.model, out.family->name(), fmt::join(reads, "\" or \""), json.where(), type,
          other.name(), fmt::join(other.presets(), ", "));
    }
    out.args = out.family->from_hf_config(json, sizes);
    LOOM_CHECK(out.args != nullptr,
               "--init-from: the {} family (--model {}) reads no Hugging Face checkpoints",
               out.family->name(), job.model);
    out.vocab_from = "the checkpoint's config.json";
    context_from = fmt::format("the checkpoint's config.json '{}'", config_json);
  } else {
    out.args = out.family->from_preset(job.model, sizes);
    if (job.vocab_size) {
      out.vocab_from = "--vocab-size";
    } else if (!out.family->vocab_from_data(job.model)) {
      out.vocab_from = fmt::format("the preset {}", job.model);
    }
  }
  out.args->validate();
  LOOM_CHECK(job.seq_len <= out.args->context(),
             "--seq-len: {} tokens per sequence is more than the model's context of {} ({}); "
             "{}",
             job.seq_len, out.args->context(), context_from,
             job.init_from.empty()
                 ? "pass a larger --block-size or a shorter --seq-len"
                 : "the checkpoint's positions fix it: pass a --seq-len of at most that");
  if (job.tp > 1) out.args->validate_tp(job.tp);
  check_context_parallel(*out.args, job.cp);
  check_expert_parallel(*out.args, job.ep);
  return out;
}

std::string model_of_init_from(const std::string& init_from, const std::string& fallback) {
  if (init_from.empty()) return fallback;
  std::error_code ec;
  const std::string config_json = models::hf::config_json_path(init_from);
  if (config_json.empty() || !std::filesystem::exists(config_json, ec)) return fallback;
  const models::hf::ConfigJson json = models::hf::ConfigJson::read(config_json);
  const std::string type = json.string_or("model_type", "");
  if (type.empty()) return fallback;
  return models::family_of_hf_model_type(type, fmt::format("--init-from: {}", json.where()))
      .presets()
      .front();
}

void fit_to_data(JobModel& model, const data::TokenCorpus& data, std::string_view flag) {
  if (model.vocab_from.empty()) {
    model.args->set_vocab_size(data.vocab_size());
  }
  // Every token read, before the first step: a shard's format implies a vocabulary (uint16:
  // GPT-2's, uint32: Llama 3's) that its tokens need not fill, so the tokens themselves decide.
  data.check_tokens_below(model.args->vocab_size(),
                          fmt::format("{} (the model's vocabulary: {})", flag,
                                      model.vocab_from.empty() ? "the data's" : model.vocab_from));
}

}  // namespace loom::train
