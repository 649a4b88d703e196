#include "models/family.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <exception>
#include <mutex>

#include "base/error.h"

namespace loom::models {

std::shared_ptr<nn::Module> ModelArgs::whole_model(uint64_t seed) const {
  return spec(seed, {}).make_stage(pipeline::StageRange::whole(n_layers()));
}

namespace {

struct Registry {
  std::mutex mutex;
  std::vector<std::unique_ptr<ModelFamily>> families;
  // A registration that failed during static initialization, reported at the first lookup.
  std::string failed;
};

Registry& registry() {
  static Registry instance;
  return instance;
}

}  // namespace

void register_model_family(std::unique_ptr<ModelFamily> family) {
  LOOM_CHECK(family != nullptr, "register_model_family: the family is null");
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  const std::vector<std::string> presets = family->presets();
  LOOM_CHECK(!presets.empty(), "register_model_family: family '{}' has no preset", family->name());
  for (const auto& other : r.families) {
    LOOM_CHECK(other->name() != family->name(),
               "register_model_family: a family named '{}' is registered already", family->name());
    for (const std::string& preset : other->presets()) {
      LOOM_CHECK(std::find(presets.begin(), presets.end(), preset) == presets.end(),
                 "register_model_family: model '{}' of family '{}' is family '{}''s already",
                 preset, family->name(), other->name());
    }
  }
  r.families.push_back(std::move(family));
}

std::vector<const ModelFamily*> model_families() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  LOOM_CHECK(r.failed.empty(), "{}", r.failed);
  std::vector<const ModelFamily*> out;
  for (const auto& family : r.families) out.push_back(family.get());
  return out;
}

std::string registered_models() {
  std::vector<std::string> parts;
  for (const ModelFamily* family : model_families()) {
    parts.push_back(fmt::format("{}: {}", family->name(), fmt::join(family->presets(), ", ")));
  }
  return parts.empty() ? "none" : fmt::format("{}", fmt::join(parts, "; "));
}

const ModelFamily& family_of_model(const std::string& model) {
  for (const ModelFamily* family : model_families()) {
    const std::vector<std::string> presets = family->presets();
    if (std::find(presets.begin(), presets.end(), model) != presets.end()) return *family;
  }
  LOOM_FAIL("--model: unknown model '{}'; the registered models are {}", model,
            registered_models());
}

const ModelFamily& family_of_hf_model_type(const std::string& model_type,
                                           const std::string& where) {
  std::vector<std::string> known;
  for (const ModelFamily* family : model_families()) {
    for (const std::string& type : family->hf_model_types()) {
      if (type == model_type) return *family;
      known.push_back(fmt::format("\"{}\" ({})", type, family->name()));
    }
  }
  LOOM_FAIL("{}: model_type \"{}\" is no registered family's; this program reads {}", where,
            model_type,
            known.empty() ? std::string("none") : fmt::format("{}", fmt::join(known, ", ")));
}

const ModelFamily& family_of_fields(const nlohmann::json& fields, const std::string& where) {
  LOOM_CHECK(fields.is_object(), "{}: the model's fields must be an object, got {}", where,
             fields.dump());
  const nlohmann::json family = fields.value("family", nlohmann::json("gpt"));
  LOOM_CHECK(family.is_string(), "{}: \"family\" must be a string, got {}", where, family.dump());
  std::vector<std::string> names;
  for (const ModelFamily* f : model_families()) {
    if (f->name() == family.get<std::string>()) return *f;
    names.push_back(f->name());
  }
  LOOM_FAIL("{}: the model is of the {} family, which this program does not register (it has {})",
            where, family.dump(), fmt::join(names, ", "));
}

int64_t int_field(const nlohmann::json& fields, const char* key, const std::string& where) {
  const auto it = fields.find(key);
  LOOM_CHECK(it != fields.end() && it->is_number_integer(),
             "{}: the model's field \"{}\" must be an integer, got {}", where, key,
             it == fields.end() ? "none" : it->dump());
  return it->get<int64_t>();
}

double number_field(const nlohmann::json& fields, const char* key, const std::string& where) {
  const auto it = fields.find(key);
  LOOM_CHECK(it != fields.end() && it->is_number(),
             "{}: the model's field \"{}\" must be a number, got {}", where, key,
             it == fields.end() ? "none" : it->dump());
  return it->get<double>();
}

void check_sizes_agree(const hf::ConfigJson& json, const std::vector<SizeAgreement>& sizes) {
  for (const SizeAgreement& s : sizes) {
    LOOM_CHECK(s.flag_value == 0 || s.flag_value == s.file_value,
               "{}: {} contradicts the checkpoint: {} has {} = {}; drop the flag (the "
               "checkpoint's sizes are used) or pick another checkpoint",
               s.flag, s.flag_value, json.where(), s.key, s.file_value);
  }
}

std::string MoESizes::first_given() const {
  if (experts != 0) return "--moe-experts";
  if (top_k != 0) return "--moe-top-k";
  if (hidden_dim != 0) return "--moe-hidden-dim";
  if (shared_experts >= 0) return "--moe-shared-experts";
  if (!score_func.empty()) return "--moe-score-func";
  if (route_norm >= 0) return "--moe-route-norm";
  if (aux_loss_coeff >= 0) return "--moe-aux-loss-coeff";
  if (bias_update_rate >= 0) return "--moe-bias-update-rate";
  if (capacity_factor >= 0) return "--moe-capacity-factor";
  if (dense_layers >= 0) return "--moe-dense-layers";
  return "";
}

void refuse_size(int64_t value, const char* flag, const std::string& family) {
  LOOM_CHECK(value == 0, "{}: the {} family has no such size (got {})", flag, family, value);
}

void refuse_dropout(const ModelSizes& sizes, const ModelFamily& family) {
  LOOM_CHECK(sizes.dropout == 0.0 || family.takes_dropout(),
             "--dropout {}: the {} family has no dropout; use --dropout 0", sizes.dropout,
             family.name());
  LOOM_CHECK(sizes.attn_dropout == 0.0 || family.takes_attention_dropout(),
             "--attn-dropout {}: the {} family has no attention dropout; use --attn-dropout 0",
             sizes.attn_dropout, family.name());
}

double dropout_probability(double p, const char* flag) {
  LOOM_CHECK(p >= 0.0 && p < 1.0, "{} {}: a dropout probability must be in [0, 1)", flag, p);
  return p;
}

namespace detail {

FamilyRegistrar::FamilyRegistrar(std::unique_ptr<ModelFamily> family) {
  try {
    register_model_family(std::move(family));
  } catch (const std::exception& error) {
    // Static initialization has no caller to throw to: every later lookup reports it.
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    if (r.failed.empty()) r.failed = error.what();
  }
}

}  // namespace detail

}  // namespace loom::models
