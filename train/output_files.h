// Output files of a job: checked before the first step, and written so that a failed write is an
// error naming the file rather than a run that "succeeds" with nothing on disk.
#pragma once

#include <string>
#include <string_view>

#include "base/durable_file.h"

namespace loom::train {

// A text file written line by line (the metrics' JSONL), in place: each line is one write, so a
// reader (or a crash) sees whole lines up to the last written; close() fsyncs the file and its
// folder. A write that fails throws naming `what` and the path.
class LineWriter {
 public:
  LineWriter() = default;
  // Opens `path`, truncated (or kAppend: continued at its end); throws naming `what` and the path
  // when it cannot.
  LineWriter(const std::string& path, std::string_view what,
             SyncedFileWriter::Mode mode = SyncedFileWriter::Mode::kTruncate);
  bool is_open() const { return file_.is_open(); }
  void write_line(std::string_view line);
  // fsyncs the file and its folder, the file staying open: the lines so far survive a crash.
  void sync();
  // fsyncs the file and its folder, then closes; throws if the last lines could not be written.
  void close();
  const std::string& path() const { return file_.path(); }

 private:
  SyncedFileWriter file_;
  std::string what_;
};

// Replaces `path` with `contents` atomically and durably (loom::write_file_atomically: a
// temporary file beside it, fsynced and renamed into place, so a reader never sees half a file);
// throws naming `what` and the path when it cannot.
void write_file(const std::string& path, std::string_view contents, std::string_view what);

}  // namespace loom::train
