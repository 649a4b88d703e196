// The main of a job program (train/job_main.h), named after the program's file: link it with a
// family's registration to train that family with the library's runner, flags and plan.
#include <string>

#include "train/job_main.h"

int main(int argc, char** argv) {
  std::string program = argc > 0 ? argv[0] : "job";
  program = program.substr(program.find_last_of('/') + 1);
  return loom::train::job_main(argc, argv, program);
}
