#include "tools/cuda_emulator/device/emulated_counts.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <string>

namespace loom_emu {
namespace {

// Written out when the process ends (a static's destructor), if asked for.
struct Counts {
  std::mutex mutex;
  std::map<std::string, long, std::less<>> by_name;

  ~Counts() {
    const char* prefix = std::getenv("LOOM_EMULATED_COUNTS");
    if (prefix == nullptr || *prefix == '\0') return;
    std::ofstream out(std::string(prefix) + "." + std::to_string(::getpid()));
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
  std::lock_guard<std::mutex> lock(c.mutex);
  auto it = c.by_name.find(what);
  if (it == c.by_name.end()) it = c.by_name.emplace(std::string(what), 0).first;
  ++it->second;
}

}  // namespace loom_emu
