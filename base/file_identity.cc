#include "base/file_identity.h"

#include <sys/stat.h>

#include <filesystem>
#include <map>

namespace loom {

namespace fs = std::filesystem;

namespace {

// The one path of a file, however it is spelled ("./m.jsonl", "runs/../m.jsonl", a link).
std::string same_file_key(const std::string& path) {
  std::error_code ec;
  const fs::path absolute = fs::absolute(path, ec);
  if (ec) return fs::path(path).lexically_normal().string();
  const fs::path canonical = fs::weakly_canonical(absolute, ec);
  return (ec ? absolute.lexically_normal() : canonical).string();
}

}  // namespace

FileIdentity::FileIdentity(const std::string& path) : key(same_file_key(path)) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) inode = std::pair{st.st_dev, st.st_ino};
}

std::vector<std::pair<size_t, size_t>> repeated_files(const std::vector<FileIdentity>& files) {
  std::vector<std::pair<size_t, size_t>> out;
  std::map<std::string, size_t> by_key;
  std::map<std::pair<dev_t, ino_t>, size_t> by_inode;
  for (size_t i = 0; i < files.size(); ++i) {
    const FileIdentity& file = files[i];
    std::optional<size_t> before;
    if (const auto it = by_key.find(file.key); it != by_key.end()) before = it->second;
    if (file.inode) {
      if (const auto it = by_inode.find(*file.inode); it != by_inode.end() && !before) {
        before = it->second;
      }
      by_inode.emplace(*file.inode, i);
    }
    by_key.emplace(file.key, i);
    if (before) out.emplace_back(i, *before);
  }
  return out;
}

}  // namespace loom
