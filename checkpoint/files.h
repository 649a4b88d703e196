// The file operations a checkpoint's atomicity rests on (POSIX): writing with fsync, syncing a
// directory (so a rename or a new file survives a crash), renaming, reading a byte range, and
// listing. Errors are loom::Error naming the path and the system's reason.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::checkpoint {

// Appends to a new file and fsyncs it on close(); the destructor closes without syncing (an
// abandoned write).
class FileWriter {
 public:
  explicit FileWriter(const std::string& path);  // creates or truncates
  ~FileWriter();
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  void write(const void* data, size_t bytes);
  // fsync, then close.
  void close();

 private:
  std::string path_;
  int fd_ = -1;
};

// Writes `text` to `path` and fsyncs it.
void write_file_synced(const std::string& path, const std::string& text);
// fsyncs a directory: its entries (new files, renames) are durable afterwards.
void sync_directory(const std::string& path);
// Reads `length` bytes at `offset`; throws naming the path when the file is shorter.
std::vector<char> read_range(const std::string& path, int64_t offset, int64_t length);
std::string read_text(const std::string& path);

}  // namespace loom::checkpoint
