#include "tools/loomrun/options.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <string_view>

#include "base/error.h"
#include "comm/launch_env.h"

namespace loom::loomrun {

static_assert(comm::kPeerFailureWait == std::chrono::seconds(10), "the help says 10 s");

namespace {

constexpr std::string_view kDescription =
    "loomrun [flags] [--] PROGRAM [ARGS...]\n\n"
    "Starts one process per rank of a Loom job on this node, with RANK, WORLD_SIZE, LOCAL_RANK,\n"
    "LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT and LOOM_AGENT_STORE=1 in each one's\n"
    "environment (the master node's loomrun serves the rendezvous store, so it outlives every "
    "rank);\n"
    "prefixes their output with \"[rank R] \", forwards SIGINT/SIGTERM/SIGHUP to them, and stops\n"
    "all ranks when one fails (exiting with that rank's status). A rank exiting 3 says another\n"
    "rank's failure ended it: loomrun waits up to 10 s for that rank, and names it instead.";

void add_flags(CLI::App& app, LaunchOptions& options) {
  app.add_option("--nproc-per-node,--nproc_per_node", options.nproc_per_node,
                 "ranks to start on this node")
      ->capture_default_str();
  app.add_option("--nnodes", options.nnodes, "nodes in the job")->capture_default_str();
  app.add_option("--node-rank,--node_rank", options.node_rank, "this node's index, 0..nnodes-1")
      ->capture_default_str();
  app.add_option("--master-addr,--master_addr", options.master_addr,
                 "address of rank 0's node (MASTER_ADDR)")
      ->capture_default_str();
  app.add_option("--master-port,--master_port", options.master_port,
                 "port on the master (MASTER_PORT); default: a free port, single node only");
  app.add_option("--timeout-s,--timeout_s", options.timeout_s,
                 "stop all ranks and exit 124 after this many seconds; 0: no limit")
      ->capture_default_str();
  app.add_option("--grace-s,--grace_s", options.grace_s,
                 "seconds between SIGTERM and SIGKILL when stopping ranks")
      ->capture_default_str();
  app.add_option("--max-restarts,--max_restarts", options.max_restarts,
                 "when a rank fails, stop the others and start the job again, up to N times "
                 "(a job that saves checkpoints resumes from its latest); a job failing at the "
                 "same step, or before its first, 3 times in a row is not restarted again")
      ->capture_default_str();
  app.add_option("--flight-recorder-dir", options.flight_recorder_dir,
                 "where the ranks dump their last operations when the job fails (merged into one "
                 "report); default: LOOM_FLIGHT_RECORDER_DIR, else a temporary folder kept only "
                 "when the job fails");
}

}  // namespace

void validate_options(const LaunchOptions& options) {
  LOOM_CHECK(options.nproc_per_node >= 1, "--nproc-per-node must be at least 1, got {}",
             options.nproc_per_node);
  LOOM_CHECK(options.nnodes >= 1, "--nnodes must be at least 1, got {}", options.nnodes);
  LOOM_CHECK(options.node_rank >= 0 && options.node_rank < options.nnodes,
             "--node-rank {} is out of range for --nnodes {}; expected 0 <= node-rank < {}",
             options.node_rank, options.nnodes, options.nnodes);
  LOOM_CHECK(options.master_port >= 0 && options.master_port <= 65535,
             "--master-port must be in 0..65535 (0: a free port), got {}", options.master_port);
  LOOM_CHECK(options.nnodes == 1 || options.master_port != 0,
             "--nnodes {} needs --master-port: every node must be given the same port "
             "(a free port is picked only for a single-node job)",
             options.nnodes);
  LOOM_CHECK(!options.master_addr.empty(), "--master-addr must not be empty");
  // Up to about three years: a job's whole run may be long, but far above (9e9 s) a deadline
  // overflows the nanosecond clock and would come at once.
  constexpr double kMaxSeconds = 1e8;
  LOOM_CHECK(options.timeout_s >= 0 && options.timeout_s <= kMaxSeconds,
             "--timeout-s must be between 0 and {:.0f} seconds (0: no limit), got {}", kMaxSeconds,
             options.timeout_s);
  LOOM_CHECK(options.grace_s >= 0 && options.grace_s <= kMaxSeconds,
             "--grace-s must be between 0 and {:.0f} seconds, got {}", kMaxSeconds,
             options.grace_s);
  LOOM_CHECK(options.max_restarts >= 0, "--max-restarts must be >= 0, got {}",
             options.max_restarts);
  LOOM_CHECK(!options.command.empty(),
             "missing the program to run; usage: loomrun [flags] -- PROGRAM [ARGS...]");
}

CommandLine parse_command_line(int argc, const char* const* argv) {
  CommandLine result;
  LaunchOptions options;
  CLI::App app{std::string(kDescription), "loomrun"};
  add_flags(app, options);
  // Stop at the first argument that is not one of our flags: it and the rest are the program.
  app.prefix_command();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    result.action = CommandLine::Action::kPrintHelp;
    result.text = app.help();
    result.exit_code = 0;
    return result;
  } catch (const CLI::ConversionError& error) {
    // CLI11 says "Could not convert: --nproc-per-node = x"; say what a value must be.
    result.text = fmt::format(
        "{}: expected a whole number (--nproc-per-node, --nnodes, --node-rank, --master-port, "
        "--max-restarts) or a number of seconds (--timeout-s, --grace-s); run 'loomrun --help' "
        "for the flags",
        error.what());
    return result;
  } catch (const CLI::ParseError& error) {
    result.text = fmt::format("{}; run 'loomrun --help' for the flags", error.what());
    return result;
  }
  std::vector<std::string> rest = app.remaining();
  if (!rest.empty() && rest.front() == "--") {
    rest.erase(rest.begin());
  } else if (!rest.empty() && rest.front().starts_with("-")) {
    // An unknown flag before the program; after `--` a leading dash would be the program's name.
    result.text = fmt::format(
        "unknown flag '{}'; run 'loomrun --help' for the flags, and put the program after "
        "'--' if its name starts with '-'",
        rest.front());
    return result;
  }
  options.command = std::move(rest);
  try {
    validate_options(options);
  } catch (const Error& error) {
    result.text = error.what();
    return result;
  }
  result.action = CommandLine::Action::kRun;
  result.options = std::move(options);
  result.exit_code = 0;
  return result;
}

}  // namespace loom::loomrun
