#include "comm/file_store.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <thread>

#include "base/error.h"
#include "base/logging.h"

namespace loom::comm {

namespace {

constexpr char kFileHeader[8] = {'L', 'O', 'O', 'M', 'F', 'S', '1', '\n'};
constexpr off_t kFileHeaderBytes = sizeof(kFileHeader);
constexpr size_t kRecordHeaderBytes = 1 + 4 + 8;
constexpr uint8_t kSetRecord = 1;
constexpr uint8_t kDeleteRecord = 2;
constexpr Duration kFirstBackoff = std::chrono::milliseconds(1);
constexpr Duration kMaxBackoff = std::chrono::milliseconds(50);

std::string errno_text(int err) {
  char buffer[256];
  return std::string(strerror_r(err, buffer, sizeof(buffer)));
}

uint64_t load_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void store_le(uint64_t v, int bytes, Bytes* out) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<uint8_t>(v >> (8 * i)));
}

std::string quoted_keys(const std::vector<std::string>& keys) {
  std::string out = "[";
  for (size_t i = 0; i < keys.size(); ++i) out += fmt::format("{}'{}'", i ? ", " : "", keys[i]);
  return out + "]";
}

// Reads exactly `size` bytes at `offset`; false on a short file.
bool pread_all(int fd, uint8_t* data, size_t size, off_t offset, const std::string& path) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, data + done, size - done, offset + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    LOOM_CHECK(n >= 0, "FileStore '{}': read failed: {}", path, errno_text(errno));
    if (n == 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

// flock() for the duration of one operation. Blocking; flock has no timeout, and holders keep
// it only for one read or append.
class FileStore::Lock {
 public:
  Lock(const FileStore& store, bool exclusive) : fd_(store.fd_) {
    while (::flock(fd_, exclusive ? LOCK_EX : LOCK_SH) != 0) {
      LOOM_CHECK(errno == EINTR, "FileStore '{}': flock failed: {}", store.path_,
                 errno_text(errno));
    }
  }
  ~Lock() { ::flock(fd_, LOCK_UN); }
  Lock(const Lock&) = delete;
  Lock& operator=(const Lock&) = delete;

 private:
  int fd_;
};

FileStore::FileStore(std::string path, int world_size, Duration timeout)
    : path_(std::move(path)), world_size_(world_size) {
  timeout_ = timeout;
  LOOM_CHECK(!path_.empty(),
             "FileStore: the path is empty; pass a file path every process can reach");
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  LOOM_CHECK(fd_ >= 0, "FileStore: cannot open '{}': {}; its directory must exist and be writable",
             path_, errno_text(errno));
  try {
    std::lock_guard<std::mutex> guard(mutex_);
    Lock lock(*this, /*exclusive=*/true);
    struct stat st {};
    LOOM_CHECK(::fstat(fd_, &st) == 0, "FileStore '{}': fstat failed: {}", path_,
               errno_text(errno));
    uint8_t header[kFileHeaderBytes] = {};
    const off_t have = std::min<off_t>(st.st_size, kFileHeaderBytes);
    pread_all(fd_, header, static_cast<size_t>(have), 0, path_);
    const bool header_ok = std::memcmp(header, kFileHeader, static_cast<size_t>(have)) == 0;
    LOOM_CHECK(header_ok,
               "FileStore: '{}' exists and is not a FileStore file (it starts with {:?} instead of "
               "{:?}); pass another path or delete the file",
               path_, std::string(reinterpret_cast<const char*>(header), static_cast<size_t>(have)),
               std::string(kFileHeader, kFileHeaderBytes));
    if (have < kFileHeaderBytes) {  // new (or a creator died before finishing the header)
      LOOM_CHECK(::ftruncate(fd_, 0) == 0 &&
                     ::pwrite(fd_, kFileHeader, kFileHeaderBytes, 0) == kFileHeaderBytes,
                 "FileStore '{}': cannot write the header: {}", path_, errno_text(errno));
    }
    synced_ = kFileHeaderBytes;
    sync_locked();
    if (world_size_ > 0) {
      const int64_t joined = add_locked(kJoinedKey, 1);
      LOOM_CHECK(
          joined <= world_size_,
          "FileStore '{}': this is instance {} to open the file, but world_size is {}; "
          "the file is probably left over from an earlier run: delete it or pass a fresh path",
          path_, joined, world_size_);
    }
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

FileStore::~FileStore() {
  if (world_size_ > 0) {
    try {
      std::lock_guard<std::mutex> guard(mutex_);
      Lock lock(*this, /*exclusive=*/true);
      sync_locked();
      if (add_locked(kLeftKey, 1) >= world_size_) ::unlink(path_.c_str());
    } catch (const std::exception& e) {
      LOOM_LOG(warn, "FileStore '{}': could not check out on destruction: {}", path_, e.what());
    }
  }
  ::close(fd_);
}

off_t FileStore::sync_locked() {
  struct stat st {};
  LOOM_CHECK(::fstat(fd_, &st) == 0, "FileStore '{}': fstat failed: {}", path_, errno_text(errno));
  if (st.st_size < synced_) {  // truncated behind our back: start over
    cache_.clear();
    synced_ = kFileHeaderBytes;
  }
  if (st.st_size <= synced_) return synced_;
  Bytes buffer(static_cast<size_t>(st.st_size - synced_));
  if (!pread_all(fd_, buffer.data(), buffer.size(), synced_, path_)) return synced_;
  size_t offset = 0;
  while (buffer.size() - offset >= kRecordHeaderBytes) {
    const uint8_t* p = buffer.data() + offset;
    const uint8_t kind = p[0];
    const uint64_t key_bytes = load_le(p + 1, 4);
    const uint64_t value_bytes = load_le(p + 5, 8);
    LOOM_CHECK(kind == kSetRecord || kind == kDeleteRecord,
               "FileStore '{}': corrupt record at byte {} (kind {}); was the file written by "
               "something else?",
               path_, synced_ + static_cast<off_t>(offset), kind);
    const uint64_t left = buffer.size() - offset - kRecordHeaderBytes;
    if (key_bytes > left || value_bytes > left - key_bytes) break;  // cut short by a crashed writer
    std::string key(reinterpret_cast<const char*>(p + kRecordHeaderBytes), key_bytes);
    if (kind == kSetRecord) {
      const uint8_t* value = p + kRecordHeaderBytes + key_bytes;
      cache_[std::move(key)] = Bytes(value, value + value_bytes);
    } else {
      cache_.erase(key);
    }
    offset += kRecordHeaderBytes + key_bytes + value_bytes;
  }
  synced_ += static_cast<off_t>(offset);
  return synced_;
}

void FileStore::append_locked(uint8_t kind, const std::string& key, const Bytes& value) {
  sync_locked();
  struct stat st {};
  LOOM_CHECK(::fstat(fd_, &st) == 0, "FileStore '{}': fstat failed: {}", path_, errno_text(errno));
  if (st.st_size > synced_) {
    LOOM_LOG(warn,
             "FileStore '{}': dropping an incomplete record of {} bytes at the end (a writer died "
             "mid-write)",
             path_, st.st_size - synced_);
    LOOM_CHECK(::ftruncate(fd_, synced_) == 0, "FileStore '{}': ftruncate failed: {}", path_,
               errno_text(errno));
  }
  Bytes record;
  record.reserve(kRecordHeaderBytes + key.size() + value.size());
  record.push_back(kind);
  store_le(key.size(), 4, &record);
  store_le(value.size(), 8, &record);
  record.insert(record.end(), key.begin(), key.end());
  record.insert(record.end(), value.begin(), value.end());
  size_t done = 0;
  while (done < record.size()) {
    const ssize_t n = ::pwrite(fd_, record.data() + done, record.size() - done,
                               synced_ + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      if (::ftruncate(fd_, synced_) != 0) {
        // Nothing more to do: the next writer truncates the partial record (see sync_locked).
      }
      LOOM_FAIL("FileStore '{}': writing key '{}' ({} bytes) failed: {}", path_, key, value.size(),
                n < 0 ? errno_text(err) : "no progress");
    }
    done += static_cast<size_t>(n);
  }
  synced_ += static_cast<off_t>(record.size());
  if (kind == kSetRecord) {
    cache_[key] = value;
  } else {
    cache_.erase(key);
  }
}

int64_t FileStore::add_locked(const std::string& key, int64_t delta) {
  sync_locked();
  int64_t current = 0;
  if (auto it = cache_.find(key); it != cache_.end()) {
    const char* begin = reinterpret_cast<const char*>(it->second.data());
    const char* end = begin + it->second.size();
    const auto [ptr, ec] = std::from_chars(begin, end, current);
    LOOM_CHECK(ec == std::errc() && ptr == end && begin != end,
               "FileStore add('{}') on '{}': the stored value '{}' is not an integer; add needs a "
               "key that is "
               "absent or was written by add",
               key, path_, std::string(begin, std::min<size_t>(it->second.size(), 64)));
  }
  int64_t result = 0;
  LOOM_CHECK(!__builtin_add_overflow(current, delta, &result),
             "FileStore add('{}') on '{}': {} + {} overflows int64", key, path_, current, delta);
  const std::string text = std::to_string(result);
  append_locked(kSetRecord, key, Bytes(text.begin(), text.end()));
  return result;
}

std::vector<std::string> FileStore::missing_locked(const std::vector<std::string>& keys) {
  sync_locked();
  std::vector<std::string> missing;
  for (const auto& k : keys) {
    if (cache_.find(k) == cache_.end()) missing.push_back(k);
  }
  return missing;
}

void FileStore::set(const std::string& key, const Bytes& value) {
  std::lock_guard<std::mutex> guard(mutex_);
  Lock lock(*this, /*exclusive=*/true);
  append_locked(kSetRecord, key, value);
}

Bytes FileStore::get(const std::string& key) {
  const Duration timeout = this->timeout();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Duration backoff = kFirstBackoff;
  while (true) {
    {
      std::lock_guard<std::mutex> guard(mutex_);
      Lock lock(*this, /*exclusive=*/false);
      sync_locked();
      if (auto it = cache_.find(key); it != cache_.end()) return it->second;
    }
    const auto now = std::chrono::steady_clock::now();
    LOOM_CHECK(now < deadline,
               "FileStore get('{}') on '{}': key '{}' was not set within the timeout of {} ms", key,
               path_, key, timeout.count());
    std::this_thread::sleep_for(
        std::min<std::chrono::steady_clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> guard(mutex_);
  Lock lock(*this, /*exclusive=*/true);
  return add_locked(key, delta);
}

bool FileStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> guard(mutex_);
  Lock lock(*this, /*exclusive=*/false);
  return missing_locked(keys).empty();
}

void FileStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Duration backoff = kFirstBackoff;
  while (true) {
    std::vector<std::string> missing;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      Lock lock(*this, /*exclusive=*/false);
      missing = missing_locked(keys);
    }
    if (missing.empty()) return;
    const auto now = std::chrono::steady_clock::now();
    LOOM_CHECK(now < deadline,
               "FileStore wait({}) on '{}': keys {} were not set within the timeout of {} ms",
               quoted_keys(keys), path_, quoted_keys(missing), timeout.count());
    std::this_thread::sleep_for(
        std::min<std::chrono::steady_clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

Bytes FileStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  std::lock_guard<std::mutex> guard(mutex_);
  Lock lock(*this, /*exclusive=*/true);
  sync_locked();
  const auto it = cache_.find(key);
  if (!holds_expected(it == cache_.end() ? nullptr : &it->second, expected)) {
    return it == cache_.end() ? Bytes() : it->second;
  }
  append_locked(kSetRecord, key, desired);
  return desired;
}

bool FileStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> guard(mutex_);
  Lock lock(*this, /*exclusive=*/true);
  sync_locked();
  if (cache_.find(key) == cache_.end()) return false;
  append_locked(kDeleteRecord, key, {});
  return true;
}

}  // namespace loom::comm
