#include "base/bazel_run.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "base/error.h"

namespace loom {

void enter_bazel_working_directory() {
  const char* folder = std::getenv("BUILD_WORKING_DIRECTORY");
  if (folder == nullptr || *folder == '\0') return;
  LOOM_CHECK(::chdir(folder) == 0,
             "BUILD_WORKING_DIRECTORY: cannot enter '{}' (where `bazel run` was started): {}",
             folder, std::strerror(errno));
  // Once: the processes this one starts inherit the folder, and a program that then moves on
  // (a script's cd) must not be taken back to it.
  ::unsetenv("BUILD_WORKING_DIRECTORY");
}

}  // namespace loom
