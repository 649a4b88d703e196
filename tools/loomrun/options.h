// loomrun's command line: what the user asked for, parsed and validated.
//
//   loomrun [--nproc-per-node N] [--nnodes M --node-rank K --master-addr A --master-port P]
//           [--timeout-s S] [--grace-s G] [--flight-recorder-dir D] [--max-restarts N]
//           [--] PROGRAM ARGS...
//
// Parsing never prints and never exits: it returns what to do (run, print help, or fail with a
// message and exit code 2), so the rules are unit-testable.
#pragma once

#include <string>
#include <vector>

namespace loom::loomrun {

// Exit code for a command line loomrun cannot accept (bad flag, failed validation).
inline constexpr int kUsageExitCode = 2;

struct LaunchOptions {
  int nproc_per_node = 1;  // ranks started on this node (LOCAL_WORLD_SIZE)
  int nnodes = 1;          // nodes in the job; WORLD_SIZE = nnodes * nproc_per_node
  int node_rank = 0;       // this node's index in [0, nnodes) (GROUP_RANK)
  std::string master_addr = "127.0.0.1";
  int master_port = 0;   // 0: the store binds a free port (only with nnodes == 1)
  double timeout_s = 0;  // stop the job after this many seconds; 0: no limit
  double grace_s = 10;   // SIGTERM -> SIGKILL escalation delay when stopping ranks
  // Where the ranks dump their flight recorders (LOOM_FLIGHT_RECORDER_DIR); "": the environment's
  // LOOM_FLIGHT_RECORDER_DIR, else a folder loomrun makes (removed when the job succeeds).
  std::string flight_recorder_dir;
  // When a rank fails, stop the others and start the job again, up to this many times (torchrun's
  // --max-restarts); the ranks get LOOM_RESTART_COUNT (0, 1, ...).
  int max_restarts = 0;
  std::vector<std::string> command;  // PROGRAM ARGS...

  int world_size() const { return nnodes * nproc_per_node; }
};

struct CommandLine {
  enum class Action { kRun, kPrintHelp, kFail };
  Action action = Action::kFail;
  LaunchOptions options;           // meaningful for kRun
  std::string text;                // help text (kPrintHelp) or error message (kFail)
  int exit_code = kUsageExitCode;  // for kPrintHelp (0) and kFail (2)
};

// Parses argv (argv[0] is loomrun itself) and validates the result. PROGRAM may follow `--`
// or simply be the first argument that is not one of loomrun's flags; everything after it is
// passed to it untouched.
CommandLine parse_command_line(int argc, const char* const* argv);

// Checks the options together; throws loom::Error whose message names the flag, the value given
// and the value expected. parse_command_line calls this.
void validate_options(const LaunchOptions& options);

}  // namespace loom::loomrun
