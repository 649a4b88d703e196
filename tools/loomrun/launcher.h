// loomrun from argv to exit code: parse, pick the port, start the ranks, supervise them.
#pragma once

namespace loom::loomrun {

// Exit codes besides the ranks' own: kUsageExitCode (2) for a bad command line, 1 when no free
// port could be picked, 127 when the program cannot be executed, 124 on --timeout-s.
inline constexpr int kSetupFailedExitCode = 1;
inline constexpr int kCannotExecuteExitCode = 127;

int run_loomrun(int argc, const char* const* argv);

}  // namespace loom::loomrun
