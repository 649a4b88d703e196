// Output files of a job: checked before the first step, and written so that a failed write is an
// error naming the file rather than a run that "succeeds" with nothing on disk.
#pragma once

#include <fstream>
#include <string>
#include <string_view>

namespace loom::train {

// Throws loom::Error naming `what` (the flag or key) and the path unless a file can be created
// or replaced at `path`: its folder exists, is a folder and is writable, and the path itself is
// not a folder. Creates nothing.
void check_writable(const std::string& path, std::string_view what);

// A text file written line by line (the metrics' JSONL): each line is flushed, and a write that
// fails throws naming the path.
class LineWriter {
 public:
  LineWriter() = default;
  // Opens (truncates) `path`; throws naming `what` and the path when it cannot.
  LineWriter(const std::string& path, std::string_view what);
  bool is_open() const { return out_.is_open(); }
  void write_line(std::string_view line);
  // Closes, throwing if the last bytes could not be written.
  void close();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

// Writes `contents` to `path` whole (through a temporary file beside it, renamed into place, so a
// reader never sees half a file); throws naming `what` and the path when it cannot.
void write_file(const std::string& path, std::string_view contents, std::string_view what);

}  // namespace loom::train
