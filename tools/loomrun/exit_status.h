// What a rank's wait status (from waitpid) means, in words and as loomrun's exit code.
#pragma once

#include <string>

namespace loom::loomrun {

// "SIGKILL" for 9, "SIGTERM" for 15; "signal 42" when the number has no name.
std::string signal_name(int signal_number);

// "exited with status 3", "was killed by signal 9 (SIGKILL)", "... (SIGSEGV), core dumped".
std::string describe_wait_status(int wait_status);

// True unless the process exited with status 0.
bool is_failure(int wait_status);

// The exit code a shell would report for it: the exit status, or 128 + the signal number.
int exit_code_of(int wait_status);

}  // namespace loom::loomrun
