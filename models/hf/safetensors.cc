#include "models/hf/safetensors.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "base/durable_file.h"
#include "base/error.h"
#include "dtensor/dtensor.h"
#include "tensor/ops.h"

namespace loom::models {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

// The reference implementation refuses headers over 100 MB; so does Loom (a corrupt length
// would otherwise ask for gigabytes).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

std::optional<DType> dtype_from_name(const std::string& name) {
  if (name == "F32") return kFloat32;
  if (name == "BF16") return kBFloat16;
  if (name == "F16") return kFloat16;
  if (name == "I32") return kInt32;
  if (name == "I64") return kInt64;
  return std::nullopt;
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

// One tensor's header entry, checked against the buffer size.
Entry parse_entry(const std::string& path, const std::string& name, const nlohmann::json& value,
                  uint64_t buffer_bytes) {
  auto where = [&] { return fmt::format("safetensors '{}': tensor '{}'", path, name); };
  LOOM_CHECK(value.is_object(), "{}: header entry must be an object, got {}", where(),
             value.dump());
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    LOOM_CHECK(value.contains(key), "{}: header entry has no \"{}\"", where(), key);
  }
  Entry entry{.name = name};
  const auto& dtype = value["dtype"];
  LOOM_CHECK(dtype.is_string(), "{}: \"dtype\" must be a string, got {}", where(), dtype.dump());
  const auto parsed = dtype_from_name(dtype.get<std::string>());
  LOOM_CHECK(parsed.has_value(),
             "{}: dtype {} is not supported (Loom reads F32, BF16, F16, I32, I64)", where(),
             dtype.dump());
  entry.dtype = *parsed;
  const auto& shape = value["shape"];
  LOOM_CHECK(shape.is_array(), "{}: \"shape\" must be an array, got {}", where(), shape.dump());
  // numel in unsigned 128-bit-safe steps: reject anything that would overflow the file anyway.
  uint64_t numel = 1;
  for (const auto& size : shape) {
    LOOM_CHECK(size.is_number_unsigned() || (size.is_number_integer() && size.get<int64_t>() >= 0),
               "{}: shape {} must hold non-negative integers", where(), shape.dump());
    const uint64_t s = size.get<uint64_t>();
    LOOM_CHECK(s == 0 || numel <= std::numeric_limits<int64_t>::max() / s,
               "{}: shape {} is too large", where(), shape.dump());
    numel *= s;
    entry.shape.push_back(static_cast<int64_t>(s));
  }
  const auto& offsets = value["data_offsets"];
  LOOM_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                 offsets[1].is_number_unsigned(),
             "{}: \"data_offsets\" must be [begin, end] with non-negative integers, got {}",
             where(), offsets.dump());
  entry.begin = offsets[0].get<uint64_t>();
  entry.end = offsets[1].get<uint64_t>();
  LOOM_CHECK(entry.begin <= entry.end, "{}: data_offsets [{}, {}] end before they begin", where(),
             entry.begin, entry.end);
  LOOM_CHECK(entry.end <= buffer_bytes,
             "{}: data_offsets [{}, {}] are out of range: the data buffer holds {} bytes (file "
             "truncated?)",
             where(), entry.begin, entry.end, buffer_bytes);
  const uint64_t expected = numel * element_size(entry.dtype);
  LOOM_CHECK(entry.end - entry.begin == expected,
             "{}: data_offsets [{}, {}] span {} bytes but shape {} of {} needs {} bytes", where(),
             entry.begin, entry.end, entry.end - entry.begin, shape_str(entry.shape),
             dtype.get<std::string>(), expected);
  return entry;
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

std::string safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case kFloat32:
      return "F32";
    case kBFloat16:
      return "BF16";
    case kFloat16:
      return "F16";
    case kInt32:
      return "I32";
    case kInt64:
      return "I64";
  }
  LOOM_INTERNAL_ASSERT(false, "unknown dtype");
  return "";
}

void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const SafetensorsMetadata& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<Tensor> data;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    LOOM_CHECK(name != "__metadata__",
               "safetensors '{}': '__metadata__' is reserved and cannot name a tensor", path);
    LOOM_CHECK(tensor.defined(), "safetensors '{}': tensor '{}' is undefined", path, name);
    LOOM_CHECK(
        !is_dtensor(tensor),
        "safetensors '{}': tensor '{}' is a DTensor; gather it with full_tensor() before saving",
        path, name);
    LOOM_CHECK(tensor.device().is_cpu(),
               "safetensors '{}': tensor '{}' is on {}; copy it to the CPU first", path, name,
               tensor.device().str());
    const Tensor contiguous = ops::contiguous(tensor);
    const uint64_t bytes =
        static_cast<uint64_t>(contiguous.numel()) * element_size(contiguous.dtype());
    header[name] = {{"dtype", safetensors_dtype_name(contiguous.dtype())},
                    {"shape", contiguous.shape()},
                    {"data_offsets", {offset, offset + bytes}}};
    data.push_back(contiguous);
    offset += (bytes + 7) / 8 * 8;  // each tensor starts 8-byte aligned
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_bytes = text.size();

  // Streamed into PATH.tmp (gigabytes are never one string), then renamed over PATH.
  AtomicFileWriter out(path, fmt::format("safetensors '{}'", path));
  out.write(&header_bytes, 8);
  out.write(text.data(), text.size());
  const std::string padding(8, '\0');
  for (const Tensor& t : data) {
    const size_t bytes = static_cast<size_t>(t.numel()) * element_size(t.dtype());
    out.write(t.raw_data(), bytes);
    out.write(padding.data(), (8 - bytes % 8) % 8);
  }
  out.commit();
}

SafetensorsFile load_safetensors(const std::string& path, bool values,
                                 const std::set<std::string>* only) {
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK(in.good(), "safetensors '{}': cannot open: {}", path, errno_text());
  in.seekg(0, std::ios::end);
  const uint64_t file_bytes = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  LOOM_CHECK(file_bytes >= 8,
             "safetensors '{}': the file is {} bytes, too short for the 8-byte header length", path,
             file_bytes);
  uint64_t header_bytes = 0;
  in.read(reinterpret_cast<char*>(&header_bytes), 8);
  LOOM_CHECK(header_bytes <= file_bytes - 8,
             "safetensors '{}': header length {} exceeds the {} bytes after it (not a safetensors "
             "file, or truncated)",
             path, header_bytes, file_bytes - 8);
  LOOM_CHECK(header_bytes <= kMaxHeaderBytes,
             "safetensors '{}': header length {} exceeds the {}-byte limit", path, header_bytes,
             kMaxHeaderBytes);
  std::string text(header_bytes, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_bytes));
  LOOM_CHECK(in.good(), "safetensors '{}': could not read the {}-byte header", path, header_bytes);
  const uint64_t buffer_bytes = file_bytes - 8 - header_bytes;

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    LOOM_FAIL("safetensors '{}': the header is not valid JSON: {}", path, e.what());
  }
  LOOM_CHECK(header.is_object(), "safetensors '{}': the header must be a JSON object, got {}", path,
             header.type_name());

  SafetensorsFile file;
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      LOOM_CHECK(value.is_object(),
                 "safetensors '{}': \"__metadata__\" must be an object of strings", path);
      for (const auto& [key, item] : value.items()) {
        LOOM_CHECK(item.is_string(),
                   "safetensors '{}': \"__metadata__\" value for '{}' must be a string, got {}",
                   path, key, item.dump());
        file.metadata[key] = item.get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(path, name, value, buffer_bytes));
  }
  // Overlap: sorted by begin, each non-empty tensor must start at or after the previous one's end.
  std::vector<const Entry*> by_begin;
  for (const Entry& e : entries)
    if (e.end > e.begin) by_begin.push_back(&e);
  std::sort(by_begin.begin(), by_begin.end(),
            [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_begin.size(); ++i) {
    const Entry& prev = *by_begin[i - 1];
    const Entry& cur = *by_begin[i];
    LOOM_CHECK(
        cur.begin >= prev.end,
        "safetensors '{}': tensor '{}' (bytes [{}, {})) overlaps tensor '{}' (bytes [{}, {}))",
        path, cur.name, cur.begin, cur.end, prev.name, prev.begin, prev.end);
  }
  // Header valid: read the data.
  for (const Entry& e : entries) {
    file.sources.emplace(e.name, TensorSource{path, 8 + header_bytes + e.begin, e.dtype, e.shape});
    if (!values || (only != nullptr && !only->count(e.name))) {
      file.tensors.emplace(e.name, Tensor::empty(e.shape, e.dtype, Device::meta()));
      continue;
    }
    Tensor t = Tensor::empty(e.shape, e.dtype);
    in.seekg(static_cast<std::streamoff>(8 + header_bytes + e.begin));
    in.read(static_cast<char*>(t.raw_data()), static_cast<std::streamsize>(e.end - e.begin));
    LOOM_CHECK(in.good(), "safetensors '{}': tensor '{}': could not read bytes [{}, {})", path,
               e.name, e.begin, e.end);
    file.tensors.emplace(e.name, std::move(t));
  }
  return file;
}

}  // namespace loom::models
