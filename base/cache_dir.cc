#include "base/cache_dir.h"

#include <cstdlib>
#include <filesystem>

namespace loom {

std::string loom_cache_dir() {
  if (const char* dir = std::getenv("LOOM_CACHE_DIR"); dir != nullptr && *dir != '\0') return dir;
  const char* home = std::getenv("HOME");
  return (std::filesystem::path(home != nullptr ? home : "/tmp") / ".cache" / "loom").string();
}

}  // namespace loom
