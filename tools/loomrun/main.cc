// loomrun: starts the ranks of a Loom job on this node, like torchrun. See launcher.h and the
// README's "Launching ranks".
#include <exception>

#include "base/bazel_run.h"
#include "tools/loomrun/launcher.h"
#include "tools/loomrun/output.h"

int main(int argc, char** argv) {
  try {
    loom::enter_bazel_working_directory();
    return loom::loomrun::run_loomrun(argc, argv);
  } catch (const std::exception& error) {
    loom::loomrun::log_line("{}", error.what());
    return 1;
  }
}
