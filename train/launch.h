// Starting a job's ranks from a program that was not launched: the program re-executes itself
// under loomrun, one process per rank (torchrun's role), with the same arguments.
#pragma once

#include <cstdint>
#include <string>

namespace loom::train {

// Whether this process is a rank a launcher started: RANK set (loomrun, torchrun),
// OMPI_COMM_WORLD_RANK (mpirun), or SLURM_PROCID within a job step (srun; not an sbatch script's
// own shell). Throws loom::Error when WORLD_SIZE is set without RANK: a launcher was meant to
// run this, never a silent one-rank run.
bool launched_as_rank();

// The world size a launcher gave this rank (comm::read_launch_env's: WORLD_SIZE,
// OMPI_COMM_WORLD_SIZE or SLURM_NTASKS); throws naming a value that is not a positive count.
int64_t launched_world_size();

// For a process not launched: sets the environment of a world of one (RANK 0, WORLD_SIZE 1).
void become_world_of_one();

// Re-executes this program (/proc/self/exe) under `launcher` with `ranks` processes and the same
// arguments (and `--max-restarts N` for the launcher when `max_restarts` > 0). Returns only by
// throwing loom::Error (no launcher given, or exec failed), naming why.
[[noreturn]] void relaunch(const std::string& launcher, int64_t ranks, const std::string& layout,
                           int argc, char** argv, int64_t max_restarts = 0);

// LOOM_RESTART_COUNT: how many times the launcher restarted this job (0: the first run).
int64_t restart_count();

}  // namespace loom::train
