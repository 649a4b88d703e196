// Starting one rank: fork + exec with its environment, its output going to pipes.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "tools/loomrun/unique_fd.h"

namespace loom::loomrun {

// A started rank. The read ends are non-blocking and close-on-exec.
struct ChildProcess {
  pid_t pid = -1;
  UniqueFd stdout_read;
  UniqueFd stderr_read;
};

// Starts `command` (command[0] is looked up in PATH unless it contains '/') with exactly
// `environment` ("NAME=value" entries). The child:
//  - leads a new process group (pgid == pid), so signal_process_group reaches anything it
//    starts, and a terminal's Ctrl-C reaches loomrun alone, which forwards it exactly once;
//  - reads stdin from /dev/null (ranks cannot share a terminal);
//  - writes stdout and stderr to the returned pipes;
//  - is killed (SIGKILL) if loomrun dies first, so a killed launcher leaves no ranks behind;
//  - starts with default signal dispositions and loomrun's original signal mask.
// Throws loom::Error naming the program and the reason when it cannot be executed (the child
// is reaped first).
ChildProcess spawn_child(const std::vector<std::string>& command,
                         const std::vector<std::string>& environment);

// Sends `signal_number` to the child's process group. Returns false when the group is gone.
bool signal_process_group(pid_t pid, int signal_number);

}  // namespace loom::loomrun
