#include "models/hf/token_settings.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include "base/durable_file.h"
#include "base/error.h"
#include "models/hf/checkpoint.h"

namespace loom::models::hf {

namespace fs = std::filesystem;

namespace {

constexpr const char* kTokenIdKeys[] = {"bos_token_id", "eos_token_id", "pad_token_id"};

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK(in.good(), "cannot read '{}'", path.string());
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

nlohmann::json parse_object(const std::string& text, const fs::path& path) {
  nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  LOOM_CHECK(json.is_object(), "'{}' is not a JSON object", path.string());
  return json;
}

}  // namespace

void copy_tokenizer_beside(const std::string& tokenizer, const std::string& save) {
  const fs::path target = tokenizer_json_path(save);
  std::error_code ec;
  if (fs::exists(target, ec) && fs::equivalent(target, tokenizer, ec)) return;
  write_file_atomically(target.string(), read_text(tokenizer), "tokenizer.json");
}

nlohmann::json read_token_settings(const std::string& path) {
  nlohmann::json settings = nlohmann::json::object();
  const fs::path config = config_json_path(path);
  std::error_code ec;
  if (fs::is_regular_file(config, ec)) {
    const nlohmann::json json = parse_object(read_text(config), config);
    nlohmann::json ids = nlohmann::json::object();
    for (const char* key : kTokenIdKeys) {
      if (json.contains(key)) ids[key] = json.at(key);
    }
    if (!ids.empty()) settings["token_ids"] = std::move(ids);
  }
  const fs::path generation = generation_config_path(path);
  if (fs::is_regular_file(generation, ec)) {
    const std::string text = read_text(generation);
    parse_object(text, generation);  // a file transformers could not read is not carried
    settings["generation_config"] = text;
  }
  return settings;
}

void write_token_settings(const nlohmann::json& settings, const std::string& save) {
  if (!settings.is_object() || settings.empty()) return;
  const fs::path config = config_json_path(save);
  if (const auto ids = settings.find("token_ids"); ids != settings.end()) {
    LOOM_CHECK(ids->is_object(), "the recorded token ids are not a JSON object: {}", ids->dump());
    nlohmann::json json = parse_object(read_text(config), config);
    for (const char* key : kTokenIdKeys) {
      if (ids->contains(key)) json[key] = ids->at(key);
    }
    write_file_atomically(config.string(), json.dump(2) + "\n", "config.json");
  }
  if (const auto generation = settings.find("generation_config"); generation != settings.end()) {
    LOOM_CHECK(generation->is_string(), "the recorded generation_config.json is not its text");
    write_file_atomically(generation_config_path(save), generation->get<std::string>(),
                          "generation_config.json");
  }
}

}  // namespace loom::models::hf
