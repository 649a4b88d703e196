#include "tools/loomrun/launcher.h"

#include <csignal>
#include <cstdlib>
#include <optional>

#include "base/error.h"
#include "comm/launch_env.h"
#include "comm/tcp_store_server.h"
#include "tools/loomrun/child_process.h"
#include "tools/loomrun/flight_folder.h"
#include "tools/loomrun/options.h"
#include "tools/loomrun/output.h"
#include "tools/loomrun/rank_env.h"
#include "tools/loomrun/restart_history.h"
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

  // Like torchrun's agent, the master node's loomrun serves the rendezvous store (the ranks get
  // LOOM_AGENT_STORE=1): it outlives every rank, so a rank 0 that fails or finishes first does
  // not take the others' failure reports or teardown with it. Port 0 binds a free port here,
  // with no window for another process to take it.
  std::unique_ptr<comm::TcpStoreServer> store;
  int master_port = options.master_port;
  if (options.node_rank == 0) {
    try {
      store = std::make_unique<comm::TcpStoreServer>(
          comm::TcpStoreServerOptions{.bind_host = comm::rendezvous_bind_host(options.master_addr),
                                      .port = options.master_port});
      master_port = store->port();
    } catch (const Error& error) {
      log_line("cannot serve the rendezvous store: {}", error.what());
      return kSetupFailedExitCode;
    }
  }

  // Handlers first, so no SIGCHLD or SIGINT between two spawns is lost. A closed stdout must not
  // kill loomrun (the ranks would be left unsupervised): ignore SIGPIPE; the ranks get it back.
  SignalPipe signals({SIGCHLD, SIGINT, SIGTERM, SIGHUP});
  signal(SIGPIPE, SIG_IGN);
  // The ranks' flight-recorder dumps (merged into one report when an attempt fails) and the
  // job's progress (the last step it completed: where a restart's failure repeats).
  std::optional<FlightRecorderFolder> made;
  try {
    made.emplace(options.flight_recorder_dir);
  } catch (const Error& error) {  // --flight-recorder-dir or LOOM_FLIGHT_RECORDER_DIR: bad input
    log_line("{}", error.what());
    return comm::kExitBadInput;
  }
  FlightRecorderFolder& flight = *made;
  std::vector<std::string> base_environment = current_environment();
  flight.export_to(base_environment);
  RestartHistory history(options.max_restarts);
  // The ranks' collective timeout (LOOM_TIMEOUT_S, else its default).
  const double stopped_alone_s = std::chrono::duration<double>(comm::timeout_from_env()).count();
  for (int attempt = 0;; ++attempt) {
    Supervisor supervisor(SupervisorConfig{.grace_s = options.grace_s,
                                           .timeout_s = options.timeout_s,
                                           .stopped_alone_s = stopped_alone_s},
                          signals);
    std::vector<std::string> environment = base_environment;
    set_variable(environment, "LOOM_RESTART_COUNT", std::to_string(attempt));
    for (int local_rank = 0; local_rank < options.nproc_per_node; ++local_rank) {
      const int rank = global_rank(options, local_rank);
      try {
        supervisor.add_rank(
            rank, spawn_child(options.command, build_rank_environment(options, local_rank,
                                                                      master_port, environment)));
      } catch (const Error& error) {
        log_line("rank {}: {}{}", rank, error.what(),
                 local_rank > 0 ? "; stopping the ranks already started" : "");
        supervisor.abort_launch(kCannotExecuteExitCode);
        break;
      }
    }
    const int exit_code = supervisor.run();
    flight.report(exit_code, options.world_size());
    supervisor.print_cause();
    if (exit_code == 0 || !supervisor.failed_by_rank()) return exit_code;
    // Exit status 2 is a Loom job's bad input (a flag, file or layout): the same on every
    // attempt, so never restarted.
    if (exit_code == comm::kExitBadInput && options.max_restarts > 0) {
      log_line(
          "a rank exited with status {} (bad input: a flag, file or layout); not restarting "
          "the job",
          exit_code);
      return exit_code;
    }
    if (!history.restart_after(supervisor.cause(), flight.completed_step())) {
      return exit_code;
    }
    flight.clear_dumps();
  }
}

}  // namespace loom::loomrun
