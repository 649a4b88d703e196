#include "models/hf/gpt2_hf.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "autograd/grad_mode.h"
#include "base/error.h"
#include "dtensor/dtensor.h"
#include "models/hf/safetensors.h"
#include "tensor/ops.h"

namespace loom::models {
namespace {

constexpr std::string_view kPrefix = "transformer.";
constexpr std::string_view kLmHead = "lm_head.weight";

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// How a Loom parameter is laid out in the HF file.
enum class Layout {
  kAsIs,         // embeddings, LayerNorms, biases other than c_attn's
  kTransposed,   // Conv1D weights: (in, out) in HF, (out, in) in Loom
  kCAttnWeight,  // transposed and its 3C features permuted
  kCAttnBias,    // 3C features permuted
};

Layout layout_of(const std::string& loom_name) {
  if (ends_with(loom_name, ".attn.c_attn.weight")) return Layout::kCAttnWeight;
  if (ends_with(loom_name, ".attn.c_attn.bias")) return Layout::kCAttnBias;
  if (ends_with(loom_name, ".c_proj.weight") || ends_with(loom_name, ".c_fc.weight"))
    return Layout::kTransposed;
  return Layout::kAsIs;
}

Shape hf_shape(const Shape& loom_shape, Layout layout) {
  if (layout == Layout::kTransposed || layout == Layout::kCAttnWeight)
    return {loom_shape.at(1), loom_shape.at(0)};
  return loom_shape;
}

Tensor transposed(const Tensor& t) { return ops::contiguous(ops::transpose(t, 0, 1)); }

// Full Loom-layout tensor -> HF layout.
Tensor to_hf(const Tensor& loom, Layout layout, const GPTConfig& config) {
  switch (layout) {
    case Layout::kAsIs:
      return ops::contiguous(loom);
    case Layout::kTransposed:
      return transposed(loom);
    case Layout::kCAttnWeight:
      return transposed(
          gather_rows(loom, c_attn_qkv_major_source(config.n_head, config.head_dim())));
    case Layout::kCAttnBias:
      return gather_rows(loom, c_attn_qkv_major_source(config.n_head, config.head_dim()));
  }
  LOOM_INTERNAL_ASSERT(false, "unknown layout");
  return {};
}

// Full HF-layout tensor -> Loom layout.
Tensor from_hf(const Tensor& hf, Layout layout, const GPTConfig& config) {
  switch (layout) {
    case Layout::kAsIs:
      return ops::contiguous(hf);
    case Layout::kTransposed:
      return transposed(hf);
    case Layout::kCAttnWeight:
      return gather_rows(transposed(hf),
                         c_attn_head_major_source(config.n_head, config.head_dim()));
    case Layout::kCAttnBias:
      return gather_rows(hf, c_attn_head_major_source(config.n_head, config.head_dim()));
  }
  LOOM_INTERNAL_ASSERT(false, "unknown layout");
  return {};
}

// HF's attention-mask buffers ("h.{i}.attn.bias", "h.{i}.attn.masked_bias"): not parameters.
bool is_hf_buffer(const std::string& key) {
  return key.starts_with("h.") &&
         (ends_with(key, ".attn.bias") || ends_with(key, ".attn.masked_bias"));
}

bool same_values(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  const Tensor fa = ops::contiguous(ops::to(a, kFloat32)),
               fb = ops::contiguous(ops::to(b, kFloat32));
  return std::memcmp(fa.raw_data(), fb.raw_data(),
                     static_cast<size_t>(fa.numel()) * sizeof(float)) == 0;
}

}  // namespace

std::vector<int64_t> c_attn_head_major_source(int64_t n_head, int64_t head_dim) {
  const int64_t channels = n_head * head_dim;
  std::vector<int64_t> source(static_cast<size_t>(3 * channels));
  for (int64_t head = 0; head < n_head; ++head)
    for (int64_t which = 0; which < 3; ++which)
      for (int64_t d = 0; d < head_dim; ++d)
        source[head * 3 * head_dim + which * head_dim + d] = which * channels + head * head_dim + d;
  return source;
}

std::vector<int64_t> c_attn_qkv_major_source(int64_t n_head, int64_t head_dim) {
  const std::vector<int64_t> head_major = c_attn_head_major_source(n_head, head_dim);
  std::vector<int64_t> source(head_major.size());
  for (size_t j = 0; j < head_major.size(); ++j) source[head_major[j]] = static_cast<int64_t>(j);
  return source;
}

Tensor gather_rows(const Tensor& tensor, const std::vector<int64_t>& source) {
  LOOM_CHECK(tensor.dim() >= 1, "gather_rows: expected a tensor with at least one dim, got {}",
             tensor.description());
  const int64_t rows = tensor.size(0);
  LOOM_CHECK(static_cast<int64_t>(source.size()) == rows,
             "gather_rows: {} source indices for {} rows", source.size(), rows);
  const Tensor in = ops::contiguous(tensor);
  Tensor out = Tensor::empty(in.shape(), in.dtype());
  const size_t row_bytes =
      rows == 0 ? 0 : static_cast<size_t>(in.numel() / rows) * element_size(in.dtype());
  const char* src = static_cast<const char*>(in.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  for (int64_t j = 0; j < rows; ++j) {
    LOOM_CHECK(source[j] >= 0 && source[j] < rows,
               "gather_rows: source index {} out of range [0, {})", source[j], rows);
    std::memcpy(dst + j * row_bytes, src + source[j] * row_bytes, row_bytes);
  }
  return out;
}

void save_gpt2_hf(const GPT& model, const std::string& path, bool write) {
  NoGradGuard no_grad;
  TensorMap tensors;
  // Every rank runs the same full_tensor collectives in named_parameters order.
  for (const auto& [name, p] : model.named_parameters()) {
    const Tensor full = is_dtensor(p) ? full_tensor(p) : p;
    if (!write) continue;
    const Tensor cpu = full.device().is_cpu() ? full : ops::to(full, Device::cpu());
    tensors.emplace(std::string(kPrefix) + name, to_hf(cpu, layout_of(name), model.config()));
  }
  if (!write) return;
  tensors.emplace(std::string(kLmHead), tensors.at(std::string(kPrefix) + "wte.weight"));
  save_safetensors(path, tensors, {{"format", "pt"}});
}

void load_gpt2_hf(GPTStage& model, const std::string& path) {
  SafetensorsFile file = load_safetensors(path);
  const std::string where = fmt::format("load_gpt2_hf '{}'", path);
  std::vector<std::string> problems;

  // File names -> Loom keys ("transformer." optional), skipping HF buffers.
  struct Found {
    std::string file_name;
    Tensor tensor;
  };
  std::map<std::string, Found> by_key;
  std::optional<Found> lm_head;
  for (auto& [name, tensor] : file.tensors) {
    const std::string key = name.starts_with(kPrefix) ? name.substr(kPrefix.size()) : name;
    if (key == kLmHead) {
      lm_head = Found{name, tensor};
      continue;
    }
    if (is_hf_buffer(key)) continue;
    const auto [it, inserted] = by_key.emplace(key, Found{name, tensor});
    if (!inserted)
      problems.push_back(
          fmt::format("tensors '{}' and '{}' are the same parameter", it->second.file_name, name));
  }

  // Check every parameter before converting anything.
  const auto params = model.named_parameters();
  std::set<std::string> used;
  for (const auto& [name, p] : params) {
    const Layout layout = layout_of(name);
    const Shape expected = hf_shape(p.shape(), layout);  // a DTensor's shape() is its global shape
    const auto it = by_key.find(name);
    if (it == by_key.end()) {
      problems.push_back(
          fmt::format("missing tensor '{}{}' (shape {})", kPrefix, name, shape_str(expected)));
      continue;
    }
    used.insert(name);
    const Tensor& t = it->second.tensor;
    if (t.shape() != expected) {
      problems.push_back(
          fmt::format("tensor '{}' has shape {} in the file but the model expects {}{}",
                      it->second.file_name, shape_str(t.shape()), shape_str(expected),
                      layout == Layout::kAsIs ? "" : " (HF Conv1D layout: (in, out))"));
    }
    if (is_floating(p.dtype()) != is_floating(t.dtype())) {
      problems.push_back(fmt::format("tensor '{}' is {} in the file but the parameter is {}",
                                     it->second.file_name, dtype_name(t.dtype()),
                                     dtype_name(p.dtype())));
    }
  }
  // A pipeline stage takes its own tensors from a whole model's file: the others' names are
  // expected there, just not used (the names of a GPT with the same blocks, sized to nothing).
  std::set<std::string> whole_model;
  const GPTStageRange& range = model.range();
  if (!(range.first && range.last && range.first_block == 0 &&
        range.end_block == model.config().n_layer)) {
    const GPT names_only(GPTConfig{.n_layer = model.config().n_layer,
                                   .n_head = 1,
                                   .n_embd = 1,
                                   .block_size = 1,
                                   .vocab_size = 1});
    for (const auto& [name, p] : names_only.named_parameters()) whole_model.insert(name);
  }
  for (const auto& [key, found] : by_key) {
    if (!used.count(key) && !whole_model.count(key)) {
      problems.push_back(fmt::format("unexpected tensor '{}'", found.file_name));
    }
  }
  if (lm_head && by_key.count("wte.weight") &&
      !same_values(lm_head->tensor, by_key.at("wte.weight").tensor)) {
    problems.push_back(
        fmt::format("tensor '{}' differs from '{}': Loom ties lm_head to wte and cannot load an "
                    "untied head",
                    lm_head->file_name, by_key.at("wte.weight").file_name));
  }
  if (!problems.empty()) {
    std::string message =
        fmt::format("{}: {} problem(s); the model is unchanged:", where, problems.size());
    for (const auto& problem : problems) message += "\n  " + problem;
    LOOM_FAIL("{}", message);
  }

  // Convert everything (and take this rank's slice of DTensor parameters) into temporaries.
  std::vector<std::pair<Tensor, Tensor>> copies;  // (destination, value)
  for (const auto& [name, p] : params) {
    Tensor value =
        ops::to(from_hf(by_key.at(name).tensor, layout_of(name), model.config()), p.dtype());
    Tensor destination = p;
    if (is_dtensor(p)) {
      const DTensorSpec& spec = dtensor_spec(p, "load_gpt2_hf");
      const Shape offset = spec.local_offset(), local = spec.local_shape();
      for (int64_t dim = 0; dim < value.dim(); ++dim)
        value = ops::narrow(value, dim, offset[dim], local[dim]);
      value = ops::contiguous(value);
      destination = local_shard(p);
    }
    LOOM_INTERNAL_ASSERT(value.shape() == destination.shape(),
                         "{}: {} converted to {} for a destination of {}", where, name,
                         shape_str(value.shape()), shape_str(destination.shape()));
    if (!destination.device().is_cpu()) value = ops::to(value, destination.device());
    copies.emplace_back(destination, value);
  }
  NoGradGuard no_grad;
  for (const auto& [destination, value] : copies) ops::copy_(destination, value);
}

std::optional<GPTConfig> read_gpt2_hf_config(const std::string& checkpoint_path) {
  const std::filesystem::path path =
      std::filesystem::path(checkpoint_path).parent_path() / "config.json";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  std::ifstream in(path);
  LOOM_CHECK(in.good(), "read_gpt2_hf_config: cannot read '{}': {}", path.string(),
             std::strerror(errno));
  nlohmann::json json;
  try {
    in >> json;
  } catch (const nlohmann::json::exception& e) {
    LOOM_FAIL("read_gpt2_hf_config: '{}' is not valid JSON: {}", path.string(), e.what());
  }
  LOOM_CHECK(json.is_object(), "read_gpt2_hf_config: '{}' must hold a JSON object", path.string());
  const auto positive = [&](const char* key) -> int64_t {
    LOOM_CHECK(json.contains(key), "read_gpt2_hf_config: '{}' has no \"{}\"", path.string(), key);
    const nlohmann::json& value = json.at(key);
    LOOM_CHECK(value.is_number_integer() && value.get<int64_t>() > 0,
               "read_gpt2_hf_config: '{}': \"{}\" must be a positive integer, got {}",
               path.string(), key, value.dump());
    return value.get<int64_t>();
  };
  GPTConfig config{.n_layer = positive("n_layer"),
                   .n_head = positive("n_head"),
                   .n_embd = positive("n_embd"),
                   .block_size = positive("n_positions"),
                   .vocab_size = positive("vocab_size")};
  config.validate();
  return config;
}

void write_gpt2_hf_config(const GPTConfig& config, const std::string& checkpoint_path) {
  const std::filesystem::path path =
      std::filesystem::path(checkpoint_path).parent_path() / "config.json";
  const nlohmann::json json{{"model_type", "gpt2"},       {"architectures", {"GPT2LMHeadModel"}},
                            {"n_layer", config.n_layer},  {"n_head", config.n_head},
                            {"n_embd", config.n_embd},    {"n_positions", config.block_size},
                            {"n_ctx", config.block_size}, {"vocab_size", config.vocab_size},
                            {"tie_word_embeddings", true}};
  std::ofstream out(path);
  out << json.dump(2) << "\n";
  out.close();
  LOOM_CHECK(out.good(), "write_gpt2_hf_config: cannot write '{}'", path.string());
}

}  // namespace loom::models
