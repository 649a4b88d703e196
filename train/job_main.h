// A job program's whole main (what `./loom train` and `./loom plan` run): the command line
// (train/job_command_line.h), the job's checks before anything starts, --plan, --calibrate,
// starting the ranks under loomrun when not launched, and the runner (train/job_runner.h). A
// program that trains its own model family is its registration and this call:
//
//   int main(int argc, char** argv) { return loom::train::job_main(argc, argv, "my_train"); }
//
// (//train:job_main_program is that main, naming the program after argv[0].)
//
// Exit statuses: 0 done; 2 a bad flag, file, environment or layout, before anything started,
// one line naming it; 1 a failure while planning or training. No exception leaves it.
#pragma once

#include <string>

namespace loom::train {

int job_main(int argc, char** argv, const std::string& program);

}  // namespace loom::train
