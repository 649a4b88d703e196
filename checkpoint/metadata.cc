#include "checkpoint/metadata.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <string_view>

#include "base/error.h"

namespace loom::checkpoint {

int64_t Box::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

std::string Box::str() const {
  std::vector<std::string> parts;
  for (size_t d = 0; d < sizes.size(); ++d)
    parts.push_back(fmt::format("{}:{}", offsets[d], offsets[d] + sizes[d]));
  return fmt::format("[{}]", fmt::join(parts, ", "));
}

Box intersect(const Box& a, const Box& b) {
  LOOM_INTERNAL_ASSERT(a.sizes.size() == b.sizes.size(), "boxes of {} and {} dims", a.sizes.size(),
                       b.sizes.size());
  Box out;
  for (size_t d = 0; d < a.sizes.size(); ++d) {
    const int64_t begin = std::max(a.offsets[d], b.offsets[d]);
    const int64_t end = std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]);
    out.offsets.push_back(begin);
    out.sizes.push_back(std::max<int64_t>(0, end - begin));
  }
  return out;
}

std::string dtype_key(DType dtype) { return std::string(dtype_name(dtype)); }

std::string rank_file_name(int rank) { return fmt::format("rank_{:05d}.bin", rank); }

DType dtype_from_key(const std::string& key, const std::string& where) {
  const std::optional<DType> dtype = dtype_from_name(key);
  LOOM_CHECK(dtype.has_value(), "{}: unknown dtype '{}' (expected f32, bf16, f16, i32 or i64)",
             where, key);
  return *dtype;
}

namespace {

// An entry's chunks as a save writes them: each inside the shape, of box.numel() x element size
// bytes inside a listed file, none overlapping another, together the whole shape. The load
// copies each chunk's bytes into its box, so a length beyond the box would write past it, and
// overlapping chunks would leave a gap that a sum of covered elements does not see.
void check_chunks(const std::string& where, const std::string& name, const Entry& entry,
                  const std::map<std::string, FileInfo>& files) {
  const int64_t element = static_cast<int64_t>(element_size(entry.dtype));
  const Box whole{Shape(entry.shape.size(), 0), entry.shape};
  // Sizes whose products fit: the counts below multiply them (a shape of [2^40, 2^40] wrapped
  // to a count that matched its chunks').
  int64_t bytes = element;
  for (const int64_t size : entry.shape) {
    LOOM_CHECK(size >= 0 && !__builtin_mul_overflow(bytes, size, &bytes),
               "{}: entry '{}' has shape {}: a size is negative, or its {} bytes exceed 2^63",
               where, name, whole.str(), dtype_name(entry.dtype));
  }
  for (const Chunk& chunk : entry.chunks) {
    LOOM_CHECK(chunk.box.offsets.size() == entry.shape.size() &&
                   chunk.box.sizes.size() == entry.shape.size(),
               "{}: entry '{}' of shape {} has a chunk at {} of another rank", where, name,
               whole.str(), chunk.box.str());
  }
  int64_t elements = 0;
  for (const Chunk& chunk : entry.chunks) {
    bool inside = true;
    for (size_t d = 0; d < entry.shape.size(); ++d) {
      inside = inside && chunk.box.offsets[d] >= 0 && chunk.box.sizes[d] >= 0 &&
               chunk.box.offsets[d] + chunk.box.sizes[d] <= entry.shape[d];
    }
    LOOM_CHECK(inside, "{}: entry '{}' of shape {} has a chunk at {}, outside it", where, name,
               whole.str(), chunk.box.str());
    LOOM_CHECK(chunk.length == chunk.box.numel() * element,
               "{}: entry '{}', chunk {}: {} bytes recorded for {} elements of {} ({} bytes)",
               where, name, chunk.box.str(), chunk.length, chunk.box.numel(),
               dtype_name(entry.dtype), chunk.box.numel() * element);
    const auto file = files.find(chunk.file);
    LOOM_CHECK(file != files.end(),
               "{}: entry '{}', chunk {} is in file '{}', which the metadata "
               "does not list",
               where, name, chunk.box.str(), chunk.file);
    LOOM_CHECK(chunk.offset >= 0 && chunk.offset + chunk.length <= file->second.bytes,
               "{}: entry '{}', chunk {}: bytes {} to {} of '{}', which records {} bytes", where,
               name, chunk.box.str(), chunk.offset, chunk.offset + chunk.length, chunk.file,
               file->second.bytes);
    elements += chunk.box.numel();
  }
  // Disjoint, by a sweep along the first dim (a save's chunks are mostly rows: near-linear).
  std::vector<const Chunk*> order;
  for (const Chunk& chunk : entry.chunks) {
    if (!chunk.box.empty()) order.push_back(&chunk);
  }
  if (!entry.shape.empty()) {
    std::sort(order.begin(), order.end(),
              [](const Chunk* a, const Chunk* b) { return a->box.offsets[0] < b->box.offsets[0]; });
    for (size_t i = 0; i < order.size(); ++i) {
      const int64_t end = order[i]->box.offsets[0] + order[i]->box.sizes[0];
      for (size_t j = i + 1; j < order.size() && order[j]->box.offsets[0] < end; ++j) {
        LOOM_CHECK(intersect(order[i]->box, order[j]->box).empty(),
                   "{}: entry '{}' has overlapping chunks {} and {}", where, name,
                   order[i]->box.str(), order[j]->box.str());
      }
    }
  }
  LOOM_CHECK(elements == whole.numel() && (!entry.shape.empty() || order.size() <= 1),
             "{}: entry '{}' of shape {}: its chunks hold {} of its {} elements", where, name,
             whole.str(), elements, whole.numel());
}

}  // namespace

nlohmann::json to_json(const Metadata& metadata) {
  nlohmann::json entries = nlohmann::json::object();
  for (const auto& [name, entry] : metadata.entries) {
    nlohmann::json chunks = nlohmann::json::array();
    for (const Chunk& c : entry.chunks) {
      chunks.push_back({{"offsets", c.box.offsets},
                        {"sizes", c.box.sizes},
                        {"file", c.file},
                        {"offset", c.offset},
                        {"length", c.length},
                        {"sha256", c.sha256},
                        {"writer", c.writer}});
    }
    entries[name] = {{"dtype", dtype_key(entry.dtype)}, {"shape", entry.shape}, {"chunks", chunks}};
  }
  nlohmann::json files = nlohmann::json::object();
  for (const auto& [name, file] : metadata.files) {
    files[name] = {{"bytes", file.bytes}, {"sha256", file.sha256}, {"writer", file.writer}};
  }
  return {{"format", "loom-distributed-checkpoint"},
          {"version", metadata.version},
          {"step", metadata.step},
          {"entries", entries},
          {"files", files},
          {"extra", metadata.extra}};
}

namespace {

// A whole number (nlohmann's get<int64_t> would take 192.5 as 192).
int64_t integer(const nlohmann::json& value, const std::string& where, std::string_view what) {
  LOOM_CHECK(value.is_number_integer(), "{}: {} is {}, not a whole number", where, what,
             value.dump());
  return value.get<int64_t>();
}

std::vector<int64_t> integers(const nlohmann::json& value, const std::string& where,
                              std::string_view what) {
  LOOM_CHECK(value.is_array(), "{}: {} is {}, not a list of whole numbers", where, what,
             value.dump());
  std::vector<int64_t> out;
  for (const nlohmann::json& v : value) out.push_back(integer(v, where, what));
  return out;
}

// A rank that wrote a file or chunk: the file a save names after it.
int writer_of(const nlohmann::json& value, const std::string& file, const std::string& where,
              std::string_view what) {
  const int64_t writer = integer(value, where, what);
  LOOM_CHECK(writer >= 0 && writer <= std::numeric_limits<int>::max() &&
                 file == rank_file_name(static_cast<int>(writer)),
             "{}: {} names file '{}' written by rank {}, but a save names rank {}'s file '{}', in "
             "the step's folder (metadata a save never writes)",
             where, what, file, writer, writer,
             writer >= 0 && writer <= std::numeric_limits<int>::max()
                 ? rank_file_name(static_cast<int>(writer))
                 : std::string("rank_NNNNN.bin"));
  return static_cast<int>(writer);
}

}  // namespace

Metadata metadata_from_json(const nlohmann::json& json, const std::string& where) {
  Metadata m;
  try {
    LOOM_CHECK(json.is_object() && json.value("format", "") == "loom-distributed-checkpoint",
               "{}: not a Loom distributed checkpoint's metadata (no \"format\": "
               "\"loom-distributed-checkpoint\")",
               where);
    m.version = static_cast<int>(integer(json.at("version"), where, "\"version\""));
    LOOM_CHECK(m.version == kMetadataVersion,
               "{}: metadata version {}, but this build reads version {} only; load it with the "
               "build that wrote it (or convert it to safetensors there)",
               where, m.version, kMetadataVersion);
    m.step = integer(json.at("step"), where, "\"step\"");
    for (const auto& [name, e] : json.at("entries").items()) {
      Entry entry;
      entry.dtype = dtype_from_key(e.at("dtype").get<std::string>(), where + ": " + name);
      const std::string field = fmt::format("entry '{}'", name);
      entry.shape = integers(e.at("shape"), where, field + ": shape");
      for (const auto& c : e.at("chunks")) {
        Chunk chunk;
        chunk.box = {integers(c.at("offsets"), where, field + ": chunk offsets"),
                     integers(c.at("sizes"), where, field + ": chunk sizes")};
        chunk.file = c.at("file").get<std::string>();
        chunk.offset = integer(c.at("offset"), where, field + ": chunk offset");
        chunk.length = integer(c.at("length"), where, field + ": chunk length");
        chunk.sha256 = c.at("sha256").get<std::string>();
        chunk.writer = writer_of(c.at("writer"), chunk.file, where,
                                 field + ", chunk " + chunk.box.str() + ",");
        LOOM_CHECK(chunk.box.offsets.size() == entry.shape.size() &&
                       chunk.box.sizes.size() == entry.shape.size(),
                   "{}: entry '{}' has a chunk of {} dims for a shape of {}", where, name,
                   chunk.box.sizes.size(), entry.shape.size());
        entry.chunks.push_back(std::move(chunk));
      }
      m.entries.emplace(name, std::move(entry));
    }
    for (const auto& [name, f] : json.at("files").items()) {
      m.files[name] = {integer(f.at("bytes"), where, fmt::format("file '{}': bytes", name)),
                       f.at("sha256").get<std::string>(),
                       writer_of(f.at("writer"), name, where, "the file list")};
    }
    m.extra = json.value("extra", nlohmann::json::object());
  } catch (const nlohmann::json::exception& e) {
    LOOM_FAIL("{}: malformed checkpoint metadata: {}", where, e.what());
  }
  for (const auto& [name, entry] : m.entries) check_chunks(where, name, entry, m.files);
  return m;
}

}  // namespace loom::checkpoint
