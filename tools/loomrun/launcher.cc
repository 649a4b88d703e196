#include "tools/loomrun/launcher.h"

#include <csignal>

#include "base/error.h"
#include "tools/loomrun/child_process.h"
#include "tools/loomrun/free_port.h"
#include "tools/loomrun/options.h"
#include "tools/loomrun/output.h"
#include "tools/loomrun/rank_env.h"
#include "tools/loomrun/signal_pipe.h"
#include "tools/loomrun/supervisor.h"

namespace loom::loomrun {

int run_loomrun(int argc, const char* const* argv) {
  const CommandLine command_line = parse_command_line(argc, argv);
  switch (command_line.action) {
    case CommandLine::Action::kPrintHelp:
      write_all(STDOUT_FILENO, command_line.text);
      return command_line.exit_code;
    case CommandLine::Action::kFail:
      log_line("{}", command_line.text);
      return command_line.exit_code;
    case CommandLine::Action::kRun:
      break;
  }
  const LaunchOptions& options = command_line.options;

  int master_port = options.master_port;
  if (master_port == 0) {
    try {
      master_port = pick_free_port(options.master_addr);
    } catch (const Error& error) {
      log_line("{}", error.what());
      return kSetupFailedExitCode;
    }
  }

  // Handlers first, so no SIGCHLD or SIGINT between two spawns is lost. A closed stdout must not
  // kill loomrun (the ranks would be left unsupervised): ignore SIGPIPE; the ranks get it back.
  SignalPipe signals({SIGCHLD, SIGINT, SIGTERM, SIGHUP});
  signal(SIGPIPE, SIG_IGN);
  Supervisor supervisor(
      SupervisorConfig{.grace_s = options.grace_s, .timeout_s = options.timeout_s}, signals);
  const std::vector<std::string> parent_environment = current_environment();
  for (int local_rank = 0; local_rank < options.nproc_per_node; ++local_rank) {
    const int rank = global_rank(options, local_rank);
    try {
      supervisor.add_rank(rank, spawn_child(options.command,
                                            build_rank_environment(options, local_rank, master_port,
                                                                   parent_environment)));
    } catch (const Error& error) {
      log_line("rank {}: {}{}", rank, error.what(),
               local_rank > 0 ? "; stopping the ranks already started" : "");
      supervisor.abort_launch(kCannotExecuteExitCode);
      break;
    }
  }
  return supervisor.run();
}

}  // namespace loom::loomrun
