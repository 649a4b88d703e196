#include "models/hf/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "autograd/grad_mode.h"
#include "base/durable_file.h"
#include "base/error.h"
#include "dtensor/dtensor.h"
#include "models/hf/file_boxes.h"
#include "tensor/ops.h"

namespace loom::models::hf {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

bool is_index(const std::string& path) { return path.ends_with(".json"); }

// A sharded checkpoint: the index's weight map, each shard read once.
SafetensorsFile read_index(const std::string& path, bool values,
                           const std::set<std::string>* only) {
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK(in.good(), "'{}': cannot read it: {}", path, std::strerror(errno));
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    LOOM_FAIL("'{}' is not valid JSON: {}", path, e.what());
  }
  LOOM_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
             "'{}': a sharded checkpoint's index needs a \"weight_map\" object (tensor name -> "
             "shard file), as save_pretrained writes it",
             path);
  std::map<std::string, std::vector<std::string>> names_by_shard;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    LOOM_CHECK(shard.is_string(), "'{}': \"weight_map\" entry '{}' must name a shard file, got {}",
               path, name, shard.dump());
    names_by_shard[shard.get<std::string>()].push_back(name);
  }
  SafetensorsFile out;
  TensorMap& tensors = out.tensors;
  const fs::path folder = fs::path(path).parent_path();
  for (const auto& [shard, names] : names_by_shard) {
    const std::string shard_path = (folder / shard).string();
    LOOM_CHECK(fs::exists(shard_path), "'{}' names the shard '{}', which does not exist", path,
               shard_path);
    SafetensorsFile shard_file = load_safetensors(shard_path, values, only);
    const TensorMap& file = shard_file.tensors;
    for (const std::string& name : names) {
      const auto it = file.find(name);
      LOOM_CHECK(it != file.end(), "'{}' puts tensor '{}' in '{}', which does not hold it", path,
                 name, shard_path);
      tensors.emplace(name, it->second);
      out.sources.emplace(name, shard_file.sources.at(name));
    }
  }
  return out;
}

// The checkpoint's tensors (a file, or an index and its shards) and where each one's bytes are.
SafetensorsFile read_checkpoint(const std::string& path, bool values,
                                const std::set<std::string>* only) {
  const std::string file = resolve_checkpoint_path(path);
  if (is_index(file)) return read_index(file, values, only);
  return load_safetensors(file, values, only);
}

// The box of a parameter this rank holds, cut out of the whole (converted) tensor.
Tensor local_box(const Tensor& whole, const Tensor& parameter) {
  if (!is_dtensor(parameter)) return whole;
  const DTensorSpec& spec = dtensor_spec(parameter, "hf::load");
  const Shape offset = spec.local_offset(), local = spec.local_shape();
  Tensor box = whole;
  for (int64_t dim = 0; dim < box.dim(); ++dim)
    box = ops::narrow(box, dim, offset[dim], local[dim]);
  return ops::contiguous(box);
}

}  // namespace

std::string resolve_checkpoint_path(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return path;
  for (const char* name : {kSingleFile, kIndexFile}) {
    const fs::path candidate = fs::path(path) / name;
    if (fs::exists(candidate, ec)) return candidate.string();
  }
  LOOM_FAIL("'{}' is a folder without {} or {} (a Hugging Face checkpoint folder holds one)", path,
            kSingleFile, kIndexFile);
}

namespace {

std::string beside(const std::string& path, const char* name) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return (fs::path(path) / name).string();
  return (fs::path(path).parent_path() / name).string();
}

}  // namespace

std::string config_json_path(const std::string& path) { return beside(path, "config.json"); }
std::string generation_config_path(const std::string& path) {
  return beside(path, "generation_config.json");
}
std::string tokenizer_json_path(const std::string& path) { return beside(path, "tokenizer.json"); }
std::vector<std::string> files_beside(const std::string& path) {
  return {config_json_path(path), generation_config_path(path), tokenizer_json_path(path)};
}

TensorMap read_tensors(const std::string& path, bool values, const std::set<std::string>* only) {
  return read_checkpoint(path, values, only).tensors;
}

namespace {

// Throws listing every problem, when there is any.
void fail_on(const std::vector<std::string>& problems, const std::string& who,
             const std::string& path) {
  if (problems.empty()) return;
  std::string message =
      fmt::format("{} '{}': {} problem(s); the model is unchanged:", who, path, problems.size());
  // The first ones say what is wrong; a model of other sizes altogether would list every tensor.
  constexpr size_t kListed = 10;
  for (size_t i = 0; i < std::min(problems.size(), kListed); ++i) message += "\n  " + problems[i];
  if (problems.size() > kListed) {
    message += fmt::format("\n  ... and {} more", problems.size() - kListed);
  }
  LOOM_FAIL("{}", message);
}

// What a load fills of `module`: its parameters, then the buffers the file holds
// (StateDictAdapter::loads_buffer).
std::vector<std::pair<std::string, Tensor>> loaded_tensors(const nn::Module& module,
                                                           const StateDictAdapter& adapter) {
  std::vector<std::pair<std::string, Tensor>> out = module.named_parameters();
  std::set<std::string> parameters;
  for (const auto& [name, p] : out) parameters.insert(name);
  for (const auto& [name, t] : module.state_dict()) {
    if (!parameters.count(name) && adapter.loads_buffer(name)) out.emplace_back(name, t);
  }
  return out;
}

// A parameter stored as one tensor per index of its dim 0 (StateDictAdapter::stacked_names):
// each of them present, of the parameter's shape without dim 0 and of its kind.
void match_stacked(const std::string& name, const Tensor& p, const std::vector<std::string>& parts,
                   const TensorMap& file, std::vector<std::string>& problems) {
  LOOM_INTERNAL_ASSERT(p.dim() >= 1 && static_cast<int64_t>(parts.size()) == p.size(0),
                       "stacked_names of '{}' lists {} tensors for shape {}", name, parts.size(),
                       shape_str(p.shape()));
  const Shape expected(p.shape().begin() + 1, p.shape().end());
  for (const std::string& part : parts) {
    const auto it = file.find(part);
    if (it == file.end()) {
      problems.push_back(fmt::format("missing tensor '{}' (shape {})", part, shape_str(expected)));
      continue;
    }
    if (it->second.shape() != expected) {
      problems.push_back(
          fmt::format("tensor '{}' has shape {} in the file but the model expects {}", part,
                      shape_str(it->second.shape()), shape_str(expected)));
    }
    if (is_floating(p.dtype()) != is_floating(it->second.dtype())) {
      problems.push_back(fmt::format("tensor '{}' is {} in the file but the parameter is {}", part,
                                     dtype_name(it->second.dtype()), dtype_name(p.dtype())));
    }
  }
}

// This rank's box [offset, offset + shape) of a parameter stored as one tensor per index of its
// dim 0: of each tensor the box holds, the box's rest read alone (1-D and 2-D tensors) or cut out
// of the whole; stacked in `dtype`.
Tensor read_stacked_box(const SafetensorsFile& headers, const std::vector<std::string>& parts,
                        const Shape& global, const Shape& offset, const Shape& shape, DType dtype,
                        const std::string& path, int64_t* bytes_read) {
  const Shape part_global(global.begin() + 1, global.end());
  const Shape part_offset(offset.begin() + 1, offset.end()),
      part_box(shape.begin() + 1, shape.end());
  if (shape[0] == 0) return Tensor::empty(shape, dtype);
  std::vector<Tensor> rows;
  for (int64_t i = 0; i < shape[0]; ++i) {
    const std::string& part = parts.at(static_cast<size_t>(offset[0] + i));
    Tensor box;
    if (part_global.size() == 1 || part_global.size() == 2) {
      box = read_box(headers.sources.at(part), {}, part_global, part_offset, part_box, bytes_read);
    } else {
      const std::set<std::string> only{part};
      box = read_checkpoint(path, /*values=*/true, &only).tensors.at(part);
      *bytes_read += static_cast<int64_t>(box.numel() * element_size(box.dtype()));
      for (int64_t d = 0; d < box.dim(); ++d)
        box = ops::narrow(box, d, part_offset[d], part_box[d]);
    }
    rows.push_back(ops::to(ops::contiguous(box), dtype));
  }
  return ops::stack(rows, 0);
}

// The file's name of each of the whole model's parameters, every name, shape and dtype of
// `module`'s checked first: throws listing every problem.
std::map<std::string, std::string> match(const nn::Module& module, const StateDictAdapter& adapter,
                                         const TensorMap& file, const std::string& path,
                                         const std::vector<std::string>& model_names,
                                         const std::string& who) {
  std::vector<std::string> problems;

  // Every parameter of the whole model -> the file's name for it (at most one may be present).
  // A parameter stored as one tensor per index of dim 0 takes each of them.
  std::map<std::string, std::string> file_name_of;
  std::set<std::string> taken;
  for (const std::string& name : model_names) {
    const std::vector<std::string> parts = adapter.stacked_names(name);
    if (!parts.empty()) {
      taken.insert(parts.begin(), parts.end());
      continue;
    }
    std::vector<std::string> present;
    for (const std::string& candidate : adapter.hf_names(name)) {
      if (file.count(candidate)) present.push_back(candidate);
    }
    if (present.size() > 1) {
      problems.push_back(
          fmt::format("tensors '{}' and '{}' are the same parameter", present[0], present[1]));
    }
    if (!present.empty()) file_name_of.emplace(name, present.front());
    taken.insert(present.begin(), present.end());
  }

  // The buffers it loads: their file names, present or not (is_buffer's tensors).
  const auto params = loaded_tensors(module, adapter);
  for (const auto& [name, p] : params) {
    if (!adapter.loads_buffer(name)) continue;
    const std::string hf = adapter.hf_names(name).at(0);
    if (file.count(hf)) file_name_of.emplace(name, hf);
  }
  // This module's parameters and loaded buffers: present, of the right shape and kind.
  for (const auto& [name, p] : params) {
    const std::vector<std::string> parts = adapter.stacked_names(name);
    if (!parts.empty()) {
      match_stacked(name, p, parts, file, problems);
      continue;
    }
    const Shape expected = adapter.hf_shape(name, p.shape());  // a DTensor's shape is global
    const auto found = file_name_of.find(name);
    if (found == file_name_of.end()) {
      problems.push_back(fmt::format("missing tensor '{}' (shape {})", adapter.hf_names(name).at(0),
                                     shape_str(expected)));
      continue;
    }
    const Tensor& t = file.at(found->second);
    if (t.shape() != expected) {
      problems.push_back(
          fmt::format("tensor '{}' has shape {} in the file but the model expects {}",
                      found->second, shape_str(t.shape()), shape_str(expected)));
    }
    if (is_floating(p.dtype()) != is_floating(t.dtype())) {
      problems.push_back(fmt::format("tensor '{}' is {} in the file but the parameter is {}",
                                     found->second, dtype_name(t.dtype()), dtype_name(p.dtype())));
    }
  }
  for (const auto& [name, tensor] : file) {
    if (!taken.count(name) && !adapter.is_buffer(name)) {
      problems.push_back(
          fmt::format("unexpected tensor '{}' (no parameter of the model takes it)", name));
    }
  }
  adapter.check_file(file, problems);
  fail_on(problems, who, path);
  return file_name_of;
}

}  // namespace

void check(const nn::Module& module, const StateDictAdapter& adapter, const std::string& path,
           const std::vector<std::string>& model_names, const std::string& who) {
  const TensorMap headers = read_tensors(path, /*values=*/false);
  match(module, adapter, headers, path, model_names, who);
  // The adapter's checks across tensors (a tied head's copy against the embeddings), before any
  // rank starts: only the checked tensors are read, and only when the file holds two of them to
  // compare (a tied model's file usually has no head).
  std::set<std::string> present;
  for (const std::string& name : adapter.checked_tensors()) {
    if (headers.count(name)) present.insert(name);
  }
  if (present.size() < 2) return;
  std::vector<std::string> problems;
  adapter.check_file(read_tensors(path, /*values=*/true, &present), problems);
  fail_on(problems, who, path);
}

LoadStats load(nn::Module& module, const StateDictAdapter& adapter, const std::string& path,
               const std::vector<std::string>& model_names, const std::string& who) {
  // The headers first (names, shapes, where each tensor's bytes are): every check of names and
  // shapes before any value is read.
  const SafetensorsFile headers = read_checkpoint(path, /*values=*/false, nullptr);
  const auto params = loaded_tensors(module, adapter);
  const std::map<std::string, std::string> file_name_of =
      match(module, adapter, headers.tensors, path, model_names, who);

  // Each parameter's box, read alone where the family states its file layout, else cut out of
  // the whole tensor; kept in the file's dtype for the adapter's checks, then converted.
  LoadStats stats;
  for (const auto& [name, source] : headers.sources) {
    stats.file_bytes +=
        shape_numel(source.shape) * static_cast<int64_t>(element_size(source.dtype));
  }
  TensorMap boxes;                                    // file name -> this rank's box
  std::map<std::string, std::pair<Shape, Shape>> at;  // file name -> (offset, shape), as laid out
  std::vector<std::pair<Tensor, Tensor>> copies;      // (destination, value)
  for (const auto& [name, p] : params) {
    Shape offset(p.shape().size(), 0), shape = p.shape();
    if (is_dtensor(p)) {
      const DTensorSpec& spec = dtensor_spec(p, "hf::load");
      offset = spec.local_offset();
      shape = spec.local_shape();
    }
    const Tensor destination = is_dtensor(p) ? local_shard(p) : p;
    if (const auto parts = adapter.stacked_names(name); !parts.empty()) {
      Tensor value = read_stacked_box(headers, parts, p.shape(), offset, shape, p.dtype(), path,
                                      &stats.bytes_read);
      if (!destination.device().is_cpu()) value = ops::to(value, destination.device());
      copies.emplace_back(destination, value);
      continue;
    }
    const std::string& file_name = file_name_of.at(name);
    const TensorSource& source = headers.sources.at(file_name);
    const auto layout = adapter.file_layout(name);
    Tensor value;
    if (layout && (p.dim() == 1 || p.dim() == 2)) {
      value = read_box(source, *layout, p.shape(), offset, shape, &stats.bytes_read);
      if (!layout->transposed && layout->row_source.empty())
        at.emplace(file_name, std::pair{offset, shape});
    } else {
      const std::set<std::string> only{file_name};
      const Tensor whole = read_checkpoint(path, /*values=*/true, &only).tensors.at(file_name);
      stats.bytes_read += static_cast<int64_t>(whole.numel() * element_size(whole.dtype()));
      value = local_box(adapter.from_hf(name, whole), p);
    }
    boxes.emplace(file_name, value);
    value = ops::to(value, p.dtype());
    LOOM_INTERNAL_ASSERT(value.shape() == destination.shape(),
                         "{}: {} converted to {} for a destination of {}", who, name,
                         shape_str(value.shape()), shape_str(destination.shape()));
    if (!destination.device().is_cpu()) value = ops::to(value, destination.device());
    copies.emplace_back(destination, value);
  }

  // The adapter's checks across the file's tensors, on this rank's boxes: a checked tensor no
  // parameter takes (GPT-2's lm_head) is read in the box of a checked parameter's tensor of its
  // shape stored as laid out (wte), else whole.
  const std::vector<std::string> checked_names = adapter.checked_tensors();
  TensorMap checked;
  for (const std::string& name : checked_names) {
    const auto header = headers.tensors.find(name);
    if (header == headers.tensors.end()) continue;
    if (const auto box = boxes.find(name); box != boxes.end()) {
      checked.emplace(name, box->second);
      continue;
    }
    const auto like = std::find_if(checked_names.begin(), checked_names.end(), [&](const auto& n) {
      return at.count(n) && headers.tensors.at(n).shape() == header->second.shape();
    });
    if (like != checked_names.end()) {
      const auto& [offset, shape] = at.at(*like);
      checked.emplace(name, read_box(headers.sources.at(name), {}, header->second.shape(), offset,
                                     shape, &stats.bytes_read));
    } else {
      const std::set<std::string> only{name};
      const Tensor whole = read_checkpoint(path, /*values=*/true, &only).tensors.at(name);
      stats.bytes_read += static_cast<int64_t>(whole.numel() * element_size(whole.dtype()));
      checked.emplace(name, whole);
    }
  }
  std::vector<std::string> problems;
  adapter.check_file(checked, problems);
  fail_on(problems, who, path);
  NoGradGuard no_grad;
  for (const auto& [destination, value] : copies) ops::copy_(destination, value);
  return stats;
}

namespace {

std::vector<std::pair<std::string, Tensor>> whole_copies(
    const std::vector<std::pair<std::string, Tensor>>& tensors, bool keep) {
  NoGradGuard no_grad;
  std::vector<std::pair<std::string, Tensor>> out;
  // Every rank runs the same full_tensor collectives, in named_parameters order.
  for (const auto& [name, p] : tensors) {
    const Tensor full = is_dtensor(p) ? full_tensor(p) : p;
    if (keep) out.emplace_back(name, ops::contiguous(ops::to(full, Device::cpu())));
  }
  return out;
}

}  // namespace

std::vector<std::pair<std::string, Tensor>> whole_parameters(const nn::Module& module,
                                                             const StateDictAdapter& adapter,
                                                             bool keep) {
  return whole_copies(loaded_tensors(module, adapter), keep);
}

std::vector<std::pair<std::string, Tensor>> whole_parameters(const nn::Module& module, bool keep) {
  return whole_copies(module.named_parameters(), keep);
}

void check_save_path(const std::string& path, std::string_view what) {
  const fs::path target(path);
  const std::string name = target.filename().string();
  LOOM_CHECK(name.ends_with(".safetensors") && name != ".safetensors",
             "{}: '{}' is not a .safetensors file name; give the file to write, e.g. '{}' "
             "(config.json is written beside it)",
             what, path, (target.parent_path() / "model.safetensors").string());
  check_writable(path, what);  // its folder, writable, and not a folder itself
}

void save(const std::vector<std::pair<std::string, Tensor>>& parameters,
          const StateDictAdapter& adapter, const std::string& path) {
  NoGradGuard no_grad;
  TensorMap tensors;
  for (const auto& [name, whole] : parameters) {
    if (const auto parts = adapter.stacked_names(name); !parts.empty()) {
      for (size_t i = 0; i < parts.size(); ++i) {
        const Tensor slice = ops::narrow(whole, 0, static_cast<int64_t>(i), 1);
        tensors.emplace(parts[i],
                        ops::contiguous(ops::reshape(
                            slice, Shape(whole.shape().begin() + 1, whole.shape().end()))));
      }
      continue;
    }
    tensors.emplace(adapter.hf_names(name).at(0), ops::contiguous(adapter.to_hf(name, whole)));
  }
  adapter.add_saved(tensors);
  save_safetensors(path, tensors, {{"format", "pt"}});
  write_file_atomically(config_json_path(path), adapter.config_json().dump(2) + "\n",
                        "config.json");
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

}  // namespace loom::models::hf
