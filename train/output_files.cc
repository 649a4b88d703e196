#include "train/output_files.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "base/error.h"

namespace loom::train {

namespace fs = std::filesystem;

void check_writable(const std::string& path, std::string_view what) {
  LOOM_CHECK(!path.empty(), "{}: the path is empty", what);
  const fs::path target(path);
  const fs::path folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  LOOM_CHECK(fs::exists(folder, ec), "{}: cannot write '{}': the folder '{}' does not exist", what,
             path, folder.string());
  LOOM_CHECK(fs::is_directory(folder, ec), "{}: cannot write '{}': '{}' is not a folder", what,
             path, folder.string());
  LOOM_CHECK(!fs::is_directory(target, ec), "{}: cannot write '{}': it is a folder", what, path);
  LOOM_CHECK(::access(folder.c_str(), W_OK | X_OK) == 0,
             "{}: cannot write '{}': the folder '{}' is not writable ({})", what, path,
             folder.string(), std::strerror(errno));
  if (fs::exists(target, ec)) {
    LOOM_CHECK(::access(target.c_str(), W_OK) == 0, "{}: cannot write '{}': {}", what, path,
               std::strerror(errno));
  }
}

LineWriter::LineWriter(const std::string& path, std::string_view what, SyncedFileWriter::Mode mode)
    : file_(path, what, mode), what_(what) {}

void LineWriter::write_line(std::string_view line) {
  LOOM_CHECK(file_.is_open(), "LineWriter: '{}' is not open", file_.path());
  std::string text(line);
  text += '\n';
  file_.write(text.data(), text.size());
}

void LineWriter::close() {
  if (!file_.is_open()) return;
  file_.close();
  sync_parent_directory(file_.path(), what_);
}

void write_file(const std::string& path, std::string_view contents, std::string_view what) {
  write_file_atomically(path, contents, what);
}

}  // namespace loom::train
