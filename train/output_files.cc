#include "train/output_files.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
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

LineWriter::LineWriter(const std::string& path, std::string_view what)
    : path_(path), out_(path, std::ios::trunc) {
  LOOM_CHECK(out_.is_open(), "{}: cannot open '{}' for writing: {}", what, path,
             std::strerror(errno));
}

void LineWriter::write_line(std::string_view line) {
  LOOM_CHECK(out_.is_open(), "LineWriter: '{}' is not open", path_);
  out_ << line << '\n' << std::flush;
  LOOM_CHECK(out_.good(), "writing '{}' failed (disk full, or the file went away?)", path_);
}

void LineWriter::close() {
  if (!out_.is_open()) return;
  out_.close();
  LOOM_CHECK(!out_.fail(), "closing '{}' failed: the last lines may be lost", path_);
}

void write_file(const std::string& path, std::string_view contents, std::string_view what) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    LOOM_CHECK(out.is_open(), "{}: cannot write '{}': {}", what, temporary, std::strerror(errno));
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    out.close();
    if (out.fail()) {
      std::remove(temporary.c_str());
      LOOM_FAIL("{}: writing '{}' failed", what, temporary);
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    std::remove(temporary.c_str());
    LOOM_FAIL("{}: cannot move '{}' to '{}': {}", what, temporary, path, std::strerror(error));
  }
}

}  // namespace loom::train
