// The environment each rank starts with: the variables torchrun sets (and comm/'s launch
// environment reads), on top of loomrun's own environment.
//
//   RANK             node_rank * nproc_per_node + local_rank
//   WORLD_SIZE       nnodes * nproc_per_node
//   LOCAL_RANK       local_rank, in [0, nproc_per_node)
//   LOCAL_WORLD_SIZE nproc_per_node
//   GROUP_RANK       node_rank
//   MASTER_ADDR      --master-addr
//   MASTER_PORT      --master-port, or the port loomrun picked
//   OMP_NUM_THREADS  only when loomrun's environment has none: the node's hardware threads
//                    divided among its ranks (at least 1), as torchrun defaults it. Each rank's
//                    OpenMP (oneDNN's GEMMs) otherwise starts one thread per core, and ranks
//                    sharing cores spin in each other's way: measured here, dp=2 on 2 cores had
//                    steps of ~1.5 s among ~0.1 s ones until each rank used 1 thread.
#pragma once

#include <string>
#include <vector>

#include "tools/loomrun/options.h"

namespace loom::loomrun {

// This node's rank numbering: the global rank of local rank `local_rank`.
int global_rank(const LaunchOptions& options, int local_rank);

// The variables above for one rank, as (name, value) pairs in the order listed.
std::vector<std::pair<std::string, std::string>> rank_variables(const LaunchOptions& options,
                                                                int local_rank, int master_port);

// `parent` ("NAME=value" entries, as in environ) with the rank variables added; an entry of the
// parent with the same name is replaced, so a stale RANK in loomrun's environment never leaks.
std::vector<std::string> build_rank_environment(const LaunchOptions& options, int local_rank,
                                                int master_port,
                                                const std::vector<std::string>& parent);

// OMP_NUM_THREADS for `ranks_per_node` ranks on `hardware_threads` (0: unknown, then 1).
int default_omp_threads(int ranks_per_node, unsigned hardware_threads);

// loomrun's own environment (environ) as "NAME=value" entries.
std::vector<std::string> current_environment();

}  // namespace loom::loomrun
