#include "tools/loomrun/exit_status.h"

#include <fmt/format.h>
#include <sys/wait.h>

#include <csignal>
#include <cstring>

namespace loom::loomrun {

std::string signal_name(int signal_number) {
  const char* abbreviation = sigabbrev_np(signal_number);  // glibc >= 2.32: "KILL" for 9
  if (abbreviation == nullptr) return fmt::format("signal {}", signal_number);
  return fmt::format("SIG{}", abbreviation);
}

std::string describe_wait_status(int wait_status) {
  if (WIFEXITED(wait_status)) return fmt::format("exited with status {}", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const int signal_number = WTERMSIG(wait_status);
    return fmt::format("was killed by signal {} ({}){}", signal_number, signal_name(signal_number),
                       WCOREDUMP(wait_status) ? ", core dumped" : "");
  }
  return fmt::format("changed state (wait status {:#x})", wait_status);
}

bool is_failure(int wait_status) {
  return !(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0);
}

int exit_code_of(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

}  // namespace loom::loomrun
