#include "train/output_files.h"

#include <filesystem>

#include "base/error.h"

namespace loom::train {

namespace fs = std::filesystem;

LineWriter::LineWriter(const std::string& path, std::string_view what, SyncedFileWriter::Mode mode)
    : file_(path, what, mode), what_(what) {}

void LineWriter::write_line(std::string_view line) {
  LOOM_CHECK(file_.is_open(), "LineWriter: '{}' is not open", file_.path());
  std::string text(line);
  text += '\n';
  file_.write(text.data(), text.size());
}

void LineWriter::sync() {
  file_.sync();
  sync_parent_directory(file_.path(), what_);
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
