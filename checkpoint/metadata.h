// A distributed checkpoint's metadata (PyTorch DCP's Metadata): per entry its global shape, dtype
// and every saved chunk (the box of the tensor it holds, and where its bytes are: file, byte
// range, SHA-256); per file its size and SHA-256; the format version; and the job's own fields
// (`extra`: the model config, the step, the data position...). Written once, as JSON
// (metadata.json), by the coordinator; read by every rank on load.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/shape.h"

namespace loom::checkpoint {

// The version this build writes and the only one it reads.
inline constexpr int kMetadataVersion = 1;

// A box of a tensor: offsets and sizes per dim (a 0-dim tensor: both empty).
struct Box {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;

  int64_t numel() const;
  bool empty() const { return numel() == 0; }
  bool operator==(const Box& other) const = default;
  // "[0:4, 8:16]"
  std::string str() const;
};

// The part two boxes share (sizes 0 when they do not overlap).
Box intersect(const Box& a, const Box& b);

// One saved chunk of an entry.
struct Chunk {
  Box box;             // in the entry's global coordinates
  std::string file;    // relative to the checkpoint's directory
  int64_t offset = 0;  // byte offset in the file
  int64_t length = 0;  // bytes: box.numel() x element size, row-major
  std::string sha256;  // of those bytes, hex
  int writer = 0;      // the rank that wrote it
};

struct Entry {
  DType dtype = kFloat32;
  Shape shape;  // global
  std::vector<Chunk> chunks;
};

struct FileInfo {
  int64_t bytes = 0;
  std::string sha256;  // of the whole file, hex
  int writer = 0;
};

// The file rank `rank` writes: "rank_00003.bin" (relative to the step's folder). A save names
// every file so; metadata that names another (a path elsewhere, another rank's) is refused.
std::string rank_file_name(int rank);

struct Metadata {
  int version = kMetadataVersion;
  int64_t step = 0;
  std::map<std::string, Entry> entries;
  std::map<std::string, FileInfo> files;
  nlohmann::json extra = nlohmann::json::object();
};

nlohmann::json to_json(const Metadata& metadata);
// Throws loom::Error naming `where` (the file) for a version this build cannot read or a
// malformed field.
Metadata metadata_from_json(const nlohmann::json& json, const std::string& where);

// "f32" <-> DType (tensor/dtype.h's names); an unknown name throws naming `where`.
std::string dtype_key(DType dtype);
DType dtype_from_key(const std::string& key, const std::string& where);

}  // namespace loom::checkpoint
