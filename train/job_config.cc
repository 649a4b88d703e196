#include "train/job_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "base/error.h"
#include "models/family.h"

namespace loom::train {

namespace {

using Range = JobOption::Range;

// What a value of `range` must be, article included: "a positive integer", "an integer",
// "-1 (the preset's) or a non-negative number".
std::string expected_value(Range range, std::string_view noun) {
  switch (range) {
    case Range::kPositive:
      return fmt::format("a positive {}", noun);
    case Range::kNonNegative:
      return fmt::format("a non-negative {}", noun);
    case Range::kPresetOrNonNegative:
      return fmt::format("-1 (the preset's) or a non-negative {}", noun);
    case Range::kDefaultOrNonNegative:
      return fmt::format("-1 (the default) or a non-negative {}", noun);
    case Range::kPresetOrSwitch:
      return "-1 (the preset's), 0 (off) or 1 (on)";
    case Range::kAny:
      break;
  }
  return fmt::format("{} {}", noun.starts_with('i') ? "an" : "a", noun);
}

// A double as TOML and the messages write it: the shortest text that reads back to it, with
// ".0" when that looks like an integer (3.0, not 3).
std::string float_text(double v) {
  std::string text = fmt::format("{}", v);
  if (text.find_first_of(".eEni") == std::string::npos) text += ".0";
  return text;
}

std::string describe(const OptionValue& value) {
  return std::visit(
      [](const auto& v) -> std::string {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, std::string>) return fmt::format("'{}'", v);
        if constexpr (std::is_same_v<V, bool>) return v ? "true" : "false";
        if constexpr (std::is_same_v<V, double>) return float_text(v);
        if constexpr (std::is_same_v<V, int64_t>) return fmt::format("{}", v);
      },
      value);
}

std::string_view type_name(const OptionValue& value) {
  switch (value.index()) {
    case 0:
      return "an integer";
    case 1:
      return "a float";
    case 2:
      return "a boolean";
    default:
      return "a string";
  }
}

template <typename Number>
void check_range(const JobOption& option, Number value, const std::string& where,
                 const OptionValue& given) {
  const bool ok =
      option.range == Range::kAny || (option.range == Range::kPositive && value > 0) ||
      (option.range == Range::kNonNegative && value >= 0) ||
      ((option.range == Range::kPresetOrNonNegative ||
        option.range == Range::kDefaultOrNonNegative) &&
       (value >= 0 || value == -1)) ||
      (option.range == Range::kPresetOrSwitch && (value == -1 || value == 0 || value == 1));
  LOOM_CHECK(ok, "{}: expected {}, got {}", where,
             expected_value(option.range, std::is_integral_v<Number> ? "integer" : "number"),
             describe(given));
  // Counts the job keeps in an int (steps, micro-batches, degrees, ...): none may wrap. The seed
  // alone is any 64-bit value.
  if constexpr (std::is_integral_v<Number>) {
    LOOM_CHECK(option.key == "seed" || value <= std::numeric_limits<int32_t>::max(),
               "{}: expected an integer of at most {}, got {}", where,
               std::numeric_limits<int32_t>::max(), describe(given));
  }
}

int64_t to_int(const JobOption& option, const OptionValue& value, const std::string& where) {
  int64_t out = 0;
  if (const auto* text = std::get_if<std::string>(&value)) {
    const char* end = text->data() + text->size();
    const auto [ptr, ec] = std::from_chars(text->data(), end, out);
    LOOM_CHECK(!text->empty() && ec == std::errc() && ptr == end, "{}: expected {}, got {}", where,
               expected_value(option.range, "integer"), describe(value));
  } else {
    LOOM_CHECK(std::holds_alternative<int64_t>(value), "{}: expected {}, got {} ({})", where,
               expected_value(option.range, "integer"), type_name(value), describe(value));
    out = std::get<int64_t>(value);
  }
  check_range(option, out, where, value);
  return out;
}

double to_double(const JobOption& option, const OptionValue& value, const std::string& where) {
  double out = 0;
  if (const auto* text = std::get_if<std::string>(&value)) {
    char* end = nullptr;
    errno = 0;
    out = std::strtod(text->c_str(), &end);
    LOOM_CHECK(
        !text->empty() && end == text->c_str() + text->size() && errno == 0 && std::isfinite(out),
        "{}: expected {}, got {}", where, expected_value(option.range, "number"), describe(value));
  } else if (const auto* i = std::get_if<int64_t>(&value)) {
    out = static_cast<double>(*i);
  } else {
    LOOM_CHECK(std::holds_alternative<double>(value), "{}: expected {}, got {} ({})", where,
               expected_value(option.range, "number"), type_name(value), describe(value));
    out = std::get<double>(value);
    LOOM_CHECK(std::isfinite(out), "{}: expected a finite number, got {}", where, out);
  }
  check_range(option, out, where, value);
  return out;
}

bool to_bool(const OptionValue& value, const std::string& where) {
  if (const auto* text = std::get_if<std::string>(&value)) {
    LOOM_CHECK(*text == "true" || *text == "false", "{}: expected true or false, got {}", where,
               describe(value));
    return *text == "true";
  }
  LOOM_CHECK(std::holds_alternative<bool>(value), "{}: expected true or false, got {} ({})", where,
             type_name(value), describe(value));
  return std::get<bool>(value);
}

std::string to_string(const JobOption& option, const OptionValue& value, const std::string& where) {
  LOOM_CHECK(std::holds_alternative<std::string>(value), "{}: expected a string, got {} ({})",
             where, type_name(value), describe(value));
  const std::string& text = std::get<std::string>(value);
  // A flag given as a value ("--plot-out=--metrics-out=", or CLI11 giving "--plot-out" the next
  // flag): a run had written its plot to a file named "--metrics-out=.dat".
  LOOM_CHECK(!text.starts_with("--"),
             "{}: got '{}', which is a flag, not a value; give the value (\"\" for none: {} \"\")",
             where, text, option.flag());
  LOOM_CHECK(
      option.choices.empty() ||
          std::find(option.choices.begin(), option.choices.end(), text) != option.choices.end(),
      "{}: expected one of {}, got {}", where, fmt::join(option.choices, ", "), describe(value));
  if (option.check_text != nullptr) option.check_text(text, where);
  return text;
}

// A TOML string with the escapes TOML requires.
std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned char>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::vector<std::string_view> keys_of(std::string_view section) {
  std::vector<std::string_view> keys;
  for (const JobOption& o : job_options()) {
    if (o.section == section) keys.push_back(o.key);
  }
  return keys;
}

std::vector<std::string_view> sections() {
  std::vector<std::string_view> out;
  for (const JobOption& o : job_options()) {
    if (std::find(out.begin(), out.end(), o.section) == out.end()) out.push_back(o.section);
  }
  return out;
}

}  // namespace

std::string JobOption::flag() const {
  std::string name(key);
  std::replace(name.begin(), name.end(), '_', '-');
  return "--" + name;
}

models::ModelSizes JobConfig::sizes() const {
  return {.n_layer = n_layer,
          .n_head = n_head,
          .n_kv_heads = n_kv_heads,
          .n_embd = n_embd,
          .ffn_dim = ffn_dim,
          .block_size = block_size,
          .vocab_size = vocab_size,
          .rope_theta = rope_theta,
          .dropout = dropout,
          .attn_dropout = attn_dropout,
          .moe = {.experts = moe_experts,
                  .top_k = moe_top_k,
                  .hidden_dim = moe_hidden_dim,
                  .shared_experts = moe_shared_experts,
                  .score_func = moe_score_func,
                  .route_norm = moe_route_norm,
                  .aux_loss_coeff = moe_aux_loss_coeff,
                  .bias_update_rate = moe_bias_update_rate,
                  .capacity_factor = moe_capacity_factor,
                  .dense_layers = moe_dense_layers}};
}

ParallelDims data_parallel_dims(const JobConfig& config, int64_t world_size) {
  LOOM_CHECK(config.dp == 0 || config.dp_replicate == 0 || config.dp == config.dp_replicate,
             "--dp is --dp-replicate's shorthand, but they differ: --dp {} and --dp-replicate {}; "
             "give one",
             config.dp, config.dp_replicate);
  LOOM_CHECK(config.dp_shard == -1 || config.dp_shard >= 1,
             "--dp-shard: expected a positive integer or -1 (the ranks the other degrees leave), "
             "got {}",
             config.dp_shard);
  ParallelDims dims{.pp = config.pp, .cp = config.cp, .tp = config.tp, .ep = config.ep};
  const bool none_given = config.dp == 0 && config.dp_replicate == 0 && config.dp_shard == 1;
  dims.dp_replicate = config.dp_replicate > 0 ? config.dp_replicate
                      : config.dp > 0         ? config.dp
                      : none_given            ? 2
                                              : 1;
  dims.dp_shard = config.dp_shard;
  if (dims.dp_shard == -1) {
    LOOM_CHECK(world_size > 0,
               "--dp-shard -1 takes the ranks the other degrees leave, but the number of ranks is "
               "not known: give --nproc N (or run under a launcher, which sets WORLD_SIZE)");
    dims = dims.resolved(world_size);
  }
  return dims;
}

void resolve_parallel_degrees(JobConfig& config, int64_t world_size) {
  // The launcher's world is the caller's to give (train/launch.h reads every launcher's).
  if (world_size <= 0) world_size = config.nproc;
  const ParallelDims dims = data_parallel_dims(config, world_size);
  config.dp = 0;
  config.dp_replicate = dims.dp_replicate;
  config.dp_shard = dims.dp_shard;
  LOOM_CHECK(config.nproc == 0 || config.nproc == dims.world_size(),
             "--nproc {}: the degrees {} make {} ranks; give degrees whose product is {} (or "
             "--dp-shard -1 to take what the others leave)",
             config.nproc, dims.str(), dims.world_size(), config.nproc);
}

std::vector<int64_t> parse_layers_per_stage(const std::string& text, const std::string& where) {
  std::vector<int64_t> out;
  if (text.empty()) return out;
  size_t begin = 0;
  while (true) {
    const size_t comma = text.find(',', begin);
    const std::string item = text.substr(begin, comma == std::string::npos ? comma : comma - begin);
    int64_t n = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), n);
    LOOM_CHECK(!item.empty() && ec == std::errc() && end == item.data() + item.size() && n >= 1,
               "{} '{}': expected positive layer counts separated by commas, one per pipeline "
               "stage (e.g. 3,5,5,3), got '{}'",
               where, text, item);
    out.push_back(n);
    if (comma == std::string::npos) return out;
    begin = comma + 1;
  }
}

void set_option(JobConfig& config, const JobOption& option, const OptionValue& value,
                const std::string& where) {
  std::visit(
      [&](auto member) {
        using T = std::remove_reference_t<decltype(config.*member)>;
        if constexpr (std::is_same_v<T, int64_t>) config.*member = to_int(option, value, where);
        if constexpr (std::is_same_v<T, double>) config.*member = to_double(option, value, where);
        if constexpr (std::is_same_v<T, bool>) config.*member = to_bool(value, where);
        if constexpr (std::is_same_v<T, std::string>) {
          config.*member = to_string(option, value, where);
        }
      },
      option.field);
  if (option.key == "layers_per_stage") parse_layers_per_stage(config.layers_per_stage, where);
  // Named where it was given (a flag, or a job file's section and key), not later as --model;
  // in a program that registers families (a job file's reader alone checks nothing here).
  if (option.key == "model" && !models::model_families().empty()) {
    try {
      models::family_of_model(config.model);
    } catch (const Error&) {
      LOOM_FAIL("{}: unknown model '{}'; the registered models are {}", where, config.model,
                models::registered_models());
    }
  }
}

std::string option_toml(const JobConfig& config, const JobOption& option) {
  return std::visit(
      [&](auto member) -> std::string {
        const auto& v = config.*member;
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) return toml_string(v);
        if constexpr (std::is_same_v<T, bool>) return v ? "true" : "false";
        if constexpr (std::is_same_v<T, int64_t>) return fmt::format("{}", v);
        if constexpr (std::is_same_v<T, double>) return float_text(v);
      },
      option.field);
}

void load_job_toml(JobConfig& config, const std::string& path) {
  std::error_code error;
  LOOM_CHECK(!std::filesystem::is_directory(path, error),
             "--config: '{}' is a folder; give the job file (TOML) itself", path);
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK(in.good(), "--config: cannot read the job file '{}': {}", path, std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  LOOM_CHECK(!in.bad(), "--config: cannot read the job file '{}'", path);
  toml::table root;
  try {
    root = toml::parse(text.str(), path);
  } catch (const toml::parse_error& e) {
    LOOM_FAIL("{}:{}:{}: not valid TOML: {}", path, e.source().begin.line, e.source().begin.column,
              e.description());
  }
  const std::vector<std::string_view> known_sections = sections();
  for (const auto& [section_key, section_node] : root) {
    const std::string section(section_key.str());
    LOOM_CHECK(
        std::find(known_sections.begin(), known_sections.end(), section) != known_sections.end(),
        "{}: unknown {} '{}'; the sections are [{}]", path,
        section_node.is_table() ? "section" : "top-level key", section,
        fmt::join(known_sections, "], ["));
    const toml::table* table = section_node.as_table();
    LOOM_CHECK(table != nullptr, "{}: '{}' must be a section ([{}]), got a value", path, section,
               section);
    for (const auto& [key_node, node] : *table) {
      const std::string key(key_node.str());
      const std::span<const JobOption> all = job_options();
      const auto option = std::find_if(all.begin(), all.end(), [&](const JobOption& o) {
        return o.section == section && o.key == key;
      });
      LOOM_CHECK(option != all.end(), "{}: unknown key '{}' in [{}]; its keys are {}", path, key,
                 section, fmt::join(keys_of(section), ", "));
      const std::string where = fmt::format("{}: [{}] {}", path, section, key);
      OptionValue value;
      if (const auto i = node.value_exact<int64_t>()) {
        value = *i;
      } else if (const auto d = node.value_exact<double>()) {
        value = *d;
      } else if (const auto b = node.value_exact<bool>()) {
        value = *b;
      } else if (const auto s = node.value_exact<std::string>()) {
        value = *s;
      } else if (const auto* counts = node.as_array(); counts && key == "layers_per_stage") {
        // [parallel] layers_per_stage = [3, 5, 5, 3], as torchtitan's job files write lists: the
        // flag's "3,5,5,3" (parse_layers_per_stage names anything that is not a count).
        std::vector<std::string> parts;
        for (const auto& count : *counts) {
          const auto n = count.value_exact<int64_t>();
          LOOM_CHECK(n.has_value(),
                     "{}: expected an array of integers (layers per stage), got an element "
                     "that is not one",
                     where);
          parts.push_back(std::to_string(*n));
        }
        value = fmt::format("{}", fmt::join(parts, ","));
      } else {
        LOOM_FAIL("{}: expected a single value, got {}", where,
                  node.is_table()   ? "a table"
                  : node.is_array() ? "an array"
                                    : "a date or time");
      }
      if (std::holds_alternative<std::string>(value) &&
          !std::holds_alternative<std::string JobConfig::*>(option->field)) {
        // A quoted number or boolean in a file is a type error, not text to parse.
        LOOM_FAIL("{}: expected {}, got a string ({})", where,
                  option->is_bool()                                            ? "true or false"
                  : std::holds_alternative<double JobConfig::*>(option->field) ? "a number"
                                                                               : "an integer",
                  describe(value));
      }
      set_option(config, *option, value, where);
    }
  }
}

std::string effective_config_path(const std::string& metrics_out) {
  const std::filesystem::path path(metrics_out);
  return (path.parent_path() / (path.stem().string() + ".config.toml")).string();
}

std::string to_toml(const JobConfig& config) {
  std::string out;
  for (std::string_view section : sections()) {
    out += fmt::format("{}[{}]\n", out.empty() ? "" : "\n", section);
    for (const JobOption& o : job_options()) {
      if (o.section == section) out += fmt::format("{} = {}\n", o.key, option_toml(config, o));
    }
  }
  return out;
}

}  // namespace loom::train
