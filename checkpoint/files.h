// Reading a checkpoint's files (POSIX): a byte range, a whole text file. Errors are loom::Error
// naming the path and the system's reason. Writing with fsync and syncing a folder are
// base/durable_file.h's (SyncedFileWriter, write_file_synced, sync_directory).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::checkpoint {

// Reads `length` bytes at `offset`; throws naming the path when the file is shorter.
std::vector<char> read_range(const std::string& path, int64_t offset, int64_t length);
std::string read_text(const std::string& path);

}  // namespace loom::checkpoint
