// loomrun: starts the ranks of a Loom job on this node, like torchrun. See launcher.h and the
// README's "Launching ranks".
#include <exception>

#include "tools/loomrun/launcher.h"
#include "tools/loomrun/output.h"

int main(int argc, char** argv) {
  try {
    return loom::loomrun::run_loomrun(argc, argv);
  } catch (const std::exception& error) {
    loom::loomrun::log_line("{}", error.what());
    return 1;
  }
}
