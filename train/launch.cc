#include "train/launch.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "comm/launch_env.h"

namespace loom::train {

namespace {

// A count from the environment above 1 (a launcher of one task is no launcher of ranks).
bool more_than_one(const char* variable) {
  const char* value = std::getenv(variable);
  return value != nullptr && std::strtoll(value, nullptr, 10) > 1;
}

}  // namespace

bool launched_as_rank() {
  // comm/launch_env.h's sources: torchrun's and loomrun's RANK; mpirun's OMPI_COMM_WORLD_RANK and
  // srun's SLURM_PROCID within a job step (SLURM_STEP_ID) when they start more than one task. An
  // sbatch script's shell has SLURM_PROCID 0 but no step, and an interactive `srun --pty bash`
  // (or `srun -n1 ./loom train`) one task: a job started there starts its own ranks.
  const bool srun_tasks =
      std::getenv("SLURM_PROCID") != nullptr &&
      (std::getenv("SLURM_STEP_ID") != nullptr || std::getenv("SLURM_STEPID") != nullptr) &&
      more_than_one(std::getenv("SLURM_STEP_NUM_TASKS") != nullptr
                        ? "SLURM_STEP_NUM_TASKS"  // the step's own count
                        : "SLURM_NTASKS");
  if (const char* mpi_rank = std::getenv("OMPI_COMM_WORLD_RANK")) {
    // mpirun's count decides whether this is one of its ranks: it must be one.
    const char* mpi_size = std::getenv("OMPI_COMM_WORLD_SIZE");
    char* end = nullptr;
    const long long n = mpi_size ? std::strtoll(mpi_size, &end, 10) : 0;
    LOOM_CHECK(mpi_size != nullptr && end != mpi_size && *end == '\0' && n >= 1,
               "OMPI_COMM_WORLD_RANK={} is set, and OMPI_COMM_WORLD_SIZE is {}: mpirun sets both "
               "for each process, the size a positive count of ranks",
               mpi_rank, mpi_size ? fmt::format("'{}'", mpi_size) : std::string("not"));
  }
  const bool mpirun_tasks =
      std::getenv("OMPI_COMM_WORLD_RANK") != nullptr && more_than_one("OMPI_COMM_WORLD_SIZE");
  if (std::getenv("RANK") != nullptr || mpirun_tasks || srun_tasks) return true;
  // A size without its rank: a launcher was meant to run this, never a silent one-rank run.
  for (const auto& [size_variable, rank_variable, launcher] :
       {std::tuple{"WORLD_SIZE", "RANK", "a launcher (loomrun, torchrun)"},
        {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "mpirun"}}) {
    const char* size = std::getenv(size_variable);
    LOOM_CHECK(size == nullptr || std::getenv(rank_variable) != nullptr,
               "{}={} is set but {} is not; {} sets both for each rank. Unset {} to let the job "
               "start its own ranks",
               size_variable, size ? size : "", rank_variable, launcher, size_variable);
  }
  return false;
}

int64_t launched_world_size() { return comm::read_launch_env().world_size; }

void become_world_of_one() {
  // One process: it is the whole world (MASTER_PORT is picked by the rendezvous).
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
}

int64_t restart_count() {
  const char* value = std::getenv("LOOM_RESTART_COUNT");
  if (value == nullptr || *value == '\0') return 0;
  char* end = nullptr;
  const long long n = std::strtoll(value, &end, 10);
  LOOM_CHECK(end != value && *end == '\0' && n >= 0,
             "LOOM_RESTART_COUNT must be a non-negative count of restarts, got '{}'", value);
  return n;
}

void relaunch(const std::string& launcher, int64_t ranks, const std::string& layout, int argc,
              char** argv, int64_t max_restarts) {
  LOOM_CHECK(!launcher.empty(),
             "{} ranks requested ({}) but no launcher: run under loomrun, or pass --launcher "
             "PATH_TO_LOOMRUN (./loom train does)",
             ranks, layout);
  std::vector<std::string> args{launcher, "--nproc-per-node", std::to_string(ranks)};
  if (max_restarts > 0) {
    args.push_back("--max-restarts");
    args.push_back(std::to_string(max_restarts));
  }
  args.push_back("--");
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  args.push_back(n > 0 ? std::string(self, n) : argv[0]);
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  std::vector<char*> c_args;
  for (auto& a : args) c_args.push_back(a.data());
  c_args.push_back(nullptr);
  std::fflush(stdout);
  execv(c_args[0], c_args.data());
  LOOM_FAIL("could not start the launcher '{}': {}", launcher, std::strerror(errno));
}

}  // namespace loom::train
