// Whether two paths are one file: one spelling ("./m.jsonl", "runs/../m.jsonl", a link to it), or
// (both existing) one inode, as a hard link is. For inputs named twice and outputs that would
// overwrite an input or each other.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom {

// Computed once per file: a data spec may name thousands of shards.
struct FileIdentity {
  std::string key;                               // the one path of the file, however spelled
  std::optional<std::pair<dev_t, ino_t>> inode;  // when the file exists
  explicit FileIdentity(const std::string& path);
  bool operator==(const FileIdentity& other) const {
    return key == other.key || (inode && other.inode && *inode == *other.inode);
  }
};

// Each file of `files` named again: {its index, the index of its first naming}, in order. One
// lookup per file.
std::vector<std::pair<size_t, size_t>> repeated_files(const std::vector<FileIdentity>& files);

}  // namespace loom
