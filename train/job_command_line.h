// A job's command line (CLI11 over the one option table, train/job_config.h): every job flag, the
// --config file, and the program's own flags (--launcher, --plan, --calibrate). What
// `./loom train` and `./loom plan` parse, and what a user's own job program may parse too.
#pragma once

#include <string>

#include "comm/launch_env.h"
#include "train/job_config.h"

namespace loom::train {

struct CommandLine {
  JobConfig job;           // the defaults, then --config FILE, then the flags given
  std::string launcher;    // loomrun, to start the ranks when not launched
  bool help = false;       // --help was printed
  bool plan = false;       // --plan: print the job's plan, starting no rank
  bool calibrate = false;  // --calibrate: measure this machine for the plan's time model
};

// Parses `argv` (printing --help's text when asked). `description` heads the help. Throws
// CLI::ParseError for flags CLI11 rejects (unknown, missing value) and loom::Error for a bad
// value or file, naming it. The data-parallel degrees are resolved (resolve_parallel_degrees).
CommandLine parse_command_line(int argc, char** argv, const std::string& description);

// Exit statuses every job program uses (comm/launch_env.h says what each tells the launcher):
// a bad flag, file or layout exits 2 before anything starts; a failure while training exits 1,
// or 3 when it was another rank's (a comm::PeerFailure).
using comm::kExitBadInput;
using comm::kExitFailed;
using comm::kExitPeerFailed;

}  // namespace loom::train
