// A Hugging Face config.json read with errors a user can act on: every missing key, value of the
// wrong type or refused feature names the file and the key ("'ckpt/config.json': "hidden_size"
// must be a positive integer, got "64""), never an exception from the JSON library.
//
//   const hf::ConfigJson json = hf::ConfigJson::read("ckpt/config.json");
//   config.dim = json.positive_int("hidden_size");
//   config.norm_eps = json.number_or("rms_norm_eps", 1e-5);
//   json.refuse_unless(!json.bool_or("attention_bias", false), "attention_bias",
//                      "Loom's Llama has no attention biases");
//
// A key holding null counts as absent (transformers writes "head_dim": null and the like).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace loom::models::hf {

class ConfigJson {
 public:
  // Reads and parses `path`; throws loom::Error naming it when it is missing, unreadable, not
  // JSON or not a JSON object.
  static ConfigJson read(const std::string& path);
  // An object already parsed (`where` names it in errors: a file, or a file and a key).
  ConfigJson(nlohmann::json json, std::string where);

  // Present and not null.
  bool has(std::string_view key) const;

  // Required values: throw naming the file and the key when absent or of another type.
  int64_t positive_int(std::string_view key) const;
  double number(std::string_view key) const;
  // Optional values: `fallback` when absent (or null); of another type, an error.
  int64_t positive_int_or(std::string_view key, int64_t fallback) const;
  int64_t non_negative_int_or(std::string_view key, int64_t fallback) const;
  double number_or(std::string_view key, double fallback) const;
  bool bool_or(std::string_view key, bool fallback) const;
  std::string string_or(std::string_view key, const std::string& fallback) const;
  // A nested object (rope_scaling), nullopt when absent; of another type, an error.
  std::optional<ConfigJson> object_or_none(std::string_view key) const;

  // Throws "'<file>': "<key>" = <value>: <why>" unless `ok`: a feature the model does not have.
  void refuse_unless(bool ok, std::string_view key, std::string_view why) const;
  // Throws "'<file>': <message>".
  [[noreturn]] void fail(std::string_view message) const;

  const std::string& where() const { return where_; }
  const nlohmann::json& json() const { return json_; }

 private:
  const nlohmann::json* find(std::string_view key) const;
  [[noreturn]] void wrong_type(std::string_view key, std::string_view expected) const;

  nlohmann::json json_;
  std::string where_;
};

}  // namespace loom::models::hf
