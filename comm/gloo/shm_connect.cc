#include "comm/gloo/shm_connect.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <vector>

#include "base/error.h"
#include "base/logging.h"
#include "comm/gloo/connect.h"

namespace loom::comm {

bool shared_memory_allowed_by_env() {
  const char* env = std::getenv("LOOM_GLOO_SHM");
  if (env == nullptr || *env == '\0') return true;
  const std::string value = env;
  if (value == "1" || value == "true" || value == "on") return true;
  if (value == "0" || value == "false" || value == "off") return false;
  LOOM_FAIL(
      "LOOM_GLOO_SHM='{}': expected 0, false or off (the groups on TCP only), or 1, true or "
      "on (shared memory between ranks on one host, the default)",
      value);
}

}  // namespace loom::comm

namespace loom::comm::gloo_detail {

namespace {

constexpr const char* kOff = "off";

std::string read_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string stat_identity(const char* path) {
  struct stat st {};
  if (::stat(path, &st) != 0) return "-";
  return fmt::format("{}:{}", st.st_dev, st.st_ino);
}

bool allowed_here(bool allowed) { return allowed && shared_memory_allowed_by_env(); }

// A name no other group on this host uses: pid, a per-process counter and random bits.
std::string unique_segment_name() {
  static std::atomic<uint64_t> counter{0};
  std::random_device random;
  return fmt::format("/loom-gloo-{}-{}-{:08x}", ::getpid(), counter++, random());
}

// Creates and sizes the segment; "" on success, else why not. posix_fallocate reserves the pages,
// so a full /dev/shm fails here instead of raising SIGBUS at the first write.
std::string create_segment(const std::string& name, size_t bytes) {
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return fmt::format("cannot create '{}': {}", name, std::strerror(errno));
  const int error = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  ::close(fd);
  if (error != 0) {
    ::shm_unlink(name.c_str());
    return fmt::format("cannot reserve {} bytes for '{}' in /dev/shm: {}", bytes, name,
                       std::strerror(error));
  }
  return "";
}

}  // namespace

std::string host_identity() {
  char hostname[256] = {};
  ::gethostname(hostname, sizeof(hostname) - 1);
  return fmt::format("{}|{}|pidns {}|shm {}", hostname,
                     read_line("/proc/sys/kernel/random/boot_id"),
                     stat_identity("/proc/self/ns/pid"), stat_identity("/dev/shm"));
}

// The bytes per rank and round: big enough that the barrier's cost is small against the copies,
// small enough that a round stays in the cache between the writer's and the readers' cores.
// At least 8 bytes per rank, so a reduce_scatter round carries an element of every piece.
size_t choose_slot_bytes(size_t asked, int world) {
  if (asked == 0) {
    if (const char* env = std::getenv("LOOM_GLOO_SHM_SLOT"))
      asked = std::strtoull(env, nullptr, 10);
  }
  if (asked == 0) asked = size_t{1} << 20;
  return std::max(asked, size_t{8} * static_cast<size_t>(world)) / 8 * 8;
}

std::unique_ptr<ShmChannel> connect_shared_memory(Store& store, int rank, int size,
                                                  Duration timeout, const GlooOptions& options,
                                                  const std::string& what) {
  if (size < 2) return nullptr;
  store.set(fmt::format("gloo/shm/host/{}", rank),
            !allowed_here(options.shared_memory) ? std::string(kOff)
            : options.host_identity.empty()      ? host_identity()
                                                 : options.host_identity);
  wait_for_ranks(store, "gloo/shm/host/", size, timeout, what, "say which host they run on");
  std::vector<std::string> hosts;
  for (int r = 0; r < size; ++r)
    hosts.push_back(store.get_string(fmt::format("gloo/shm/host/{}", r)));
  for (int r = 0; r < size; ++r) {
    if (hosts[r] == kOff) return nullptr;      // some rank turned it off
    if (hosts[r] != hosts[0]) return nullptr;  // not all on one host: TCP
  }

  size_t slot = choose_slot_bytes(options.shared_memory_slot_bytes, size);
  std::unique_ptr<ShmChannel> channel;
  std::string status;  // "" when this rank has the segment mapped
  std::string name;
  bool created = false;
  // Rank 0 unlinks the segment when it leaves this function: every rank has mapped it by then (or
  // failed), and the mappings keep it alive.
  struct Unlink {
    const std::string& name;
    const bool& created;
    ~Unlink() {
      if (created) ::shm_unlink(name.c_str());
    }
  } unlink{name, created};
  if (rank == 0) {
    name = unique_segment_name();
    status = create_segment(name, ShmChannel::segment_bytes(size, slot));
    created = status.empty();
    if (created) {
      try {
        channel = std::make_unique<ShmChannel>(name, rank, size, slot, /*create=*/true);
      } catch (const Error& e) {
        status = e.what();
      }
    }
    store.set("gloo/shm/segment",
              status.empty() ? fmt::format("{} {}", slot, name) : std::string("!") + status);
  } else {
    try {
      store.wait({"gloo/shm/segment"}, timeout);
    } catch (const Error&) {
      LOOM_FAIL("{}: rank 0 did not create the group's shared memory within {} ms", what,
                timeout.count());
    }
    const std::string segment = store.get_string("gloo/shm/segment");
    if (!segment.empty() && segment[0] == '!') {
      status = segment.substr(1);
    } else {
      const size_t space = segment.find(' ');
      slot = std::strtoull(segment.substr(0, space).c_str(), nullptr, 10);
      name = segment.substr(space + 1);
      try {
        channel = std::make_unique<ShmChannel>(name, rank, size, slot, /*create=*/false);
      } catch (const Error& e) {
        status = e.what();
      }
    }
  }
  store.set(fmt::format("gloo/shm/opened/{}", rank), status.empty() ? std::string("ok") : status);
  wait_for_ranks(store, "gloo/shm/opened/", size, timeout, what, "open the shared memory");
  for (int r = 0; r < size; ++r) {
    const std::string opened = store.get_string(fmt::format("gloo/shm/opened/{}", r));
    if (opened != "ok") {
      if (rank == 0) {
        LOOM_LOG(warn, "{}: staying on TCP: rank {} could not use shared memory: {}", what, r,
                 opened);
      }
      return nullptr;
    }
  }
  return channel;
}

}  // namespace loom::comm::gloo_detail
