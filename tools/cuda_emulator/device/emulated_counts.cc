#include "tools/cuda_emulator/device/emulated_counts.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <string>

namespace loom_emu {
namespace {

// Kept only when asked for (LOOM_EMULATED_COUNTS), and written out when the process ends (a
// static's destructor) to <prefix>.<RANK> (a launcher's rank; the pid without one).
struct Counts {
  const char* prefix = std::getenv("LOOM_EMULATED_COUNTS");
  const bool enabled = prefix != nullptr && *prefix != '\0';
  std::mutex mutex;
  std::map<std::string, long, std::less<>> by_name;

  ~Counts() {
    if (!enabled) return;
    std::lock_guard<std::mutex> lock(mutex);
    const char* rank = std::getenv("RANK");
    std::ofstream out(std::string(prefix) + "." +
                      (rank != nullptr && *rank != '\0' ? std::string(rank)
                                                        : "pid" + std::to_string(::getpid())));
    for (const auto& [name, n] : by_name) out << n << ' ' << name << '\n';
  }
};

Counts& counts() {
  static Counts c;
  return c;
}

}  // namespace

void count(std::string_view what) {
  Counts& c = counts();
  if (!c.enabled) return;
  std::lock_guard<std::mutex> lock(c.mutex);
  auto it = c.by_name.find(what);
  if (it == c.by_name.end()) it = c.by_name.emplace(std::string(what), 0).first;
  ++it->second;
}

}  // namespace loom_emu
