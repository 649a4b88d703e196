// verify_checkpoint: checks a distributed checkpoint whole — the marker's metadata SHA-256, every
// file's size and SHA-256, every chunk's, and that its entries are the parameters, AdamW state
// and module state of the model it records, its trainer step its step (what --resume checks
// against the job's model, train/job_checks.h) — and says what it checked, or names what is
// wrong.
//
//   bazel run //tools/checkpoint:verify_checkpoint -- ckpt                    # the latest step
//   bazel run //tools/checkpoint:verify_checkpoint -- ckpt/step_00000008
//
// Exit 0: verified; 1: damaged or not a checkpoint (the message names the entry, file and rank);
// 2: bad arguments.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>

#include "base/bazel_run.h"
#include "checkpoint/distributed_checkpoint.h"
#include "train/job_checks.h"

int main(int argc, char** argv) {
  CLI::App app{"Checks a distributed checkpoint's files and checksums"};
  std::string path;
  app.add_option("checkpoint", path, "a step directory, or a checkpoint directory (its latest)")
      ->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help 0; a bad command line 2, not CLI11's own codes
  }
  try {
    loom::enter_bazel_working_directory();
    const std::string dir = loom::checkpoint::resolve_step_directory(path);
    const auto summary = loom::checkpoint::verify(dir);
    // A job's checkpoint: its entries are those of the model it records, as --resume checks.
    const std::vector<std::string> warnings =
        loom::train::check_checkpoint_contents(loom::checkpoint::read_metadata(dir), dir, "");
    fmt::print(
        "verify_checkpoint: {}: {} entries in {} files, {} bytes: every checksum matches, and "
        "they are the parameters and AdamW state of the model it records\n",
        dir, summary.entries, summary.files, summary.bytes);
    for (const std::string& warning : warnings)
      fmt::print(stderr, "verify_checkpoint: {}\n", warning);
    // Given the checkpoint folder: what the latest committed step passed over (a save that did
    // not commit, which --resume warns about and the next save deletes).
    if (!loom::checkpoint::is_step_directory(path)) {
      const std::vector<std::string> uncommitted =
          loom::checkpoint::uncommitted_step_directories(path);
      if (!uncommitted.empty()) {
        fmt::print(stderr,
                   "verify_checkpoint: note: '{}' also holds {} step folder(s) no save committed "
                   "({}): not verified, and not what --resume loads (the next save deletes "
                   "them)\n",
                   path, uncommitted.size(), fmt::join(uncommitted, ", "));
      }
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "verify_checkpoint: {}\n", e.what());
    return 1;
  }
  return 0;
}
