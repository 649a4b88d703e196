#include "tools/loomrun/rank_env.h"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>
#include <thread>

#include "base/error.h"

extern char** environ;

namespace loom::loomrun {

int global_rank(const LaunchOptions& options, int local_rank) {
  LOOM_INTERNAL_ASSERT(local_rank >= 0 && local_rank < options.nproc_per_node,
                       "local rank {} of {}", local_rank, options.nproc_per_node);
  return options.node_rank * options.nproc_per_node + local_rank;
}

std::vector<std::pair<std::string, std::string>> rank_variables(const LaunchOptions& options,
                                                                int local_rank, int master_port) {
  LOOM_INTERNAL_ASSERT(master_port > 0 && master_port <= 65535, "master port {}", master_port);
  return {
      {"RANK", std::to_string(global_rank(options, local_rank))},
      {"WORLD_SIZE", std::to_string(options.world_size())},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(options.nproc_per_node)},
      {"GROUP_RANK", std::to_string(options.node_rank)},
      {"MASTER_ADDR", options.master_addr},
      {"MASTER_PORT", std::to_string(master_port)},
      // The master node's loomrun serves the rendezvous store (launcher.cc).
      {"LOOM_AGENT_STORE", "1"},
  };
}

std::vector<std::string> build_rank_environment(const LaunchOptions& options, int local_rank,
                                                int master_port,
                                                const std::vector<std::string>& parent) {
  const auto variables = rank_variables(options, local_rank, master_port);
  std::vector<std::string> environment;
  environment.reserve(parent.size() + variables.size());
  for (const std::string& entry : parent) {
    const std::string_view name = std::string_view(entry).substr(0, entry.find('='));
    bool overridden = false;
    for (const auto& [variable, value] : variables) overridden |= (name == variable);
    // mpirun's per-process variables describe loomrun's own place (mpirun -n 1 ./loom train),
    // not its ranks': left in, they would contradict RANK (comm/launch_env.h cross-checks them).
    overridden |= name.starts_with("OMPI_COMM_WORLD_");
    if (!overridden) environment.push_back(entry);
  }
  for (const auto& [variable, value] : variables) {
    environment.push_back(fmt::format("{}={}", variable, value));
  }
  const bool user_set_threads =
      std::any_of(parent.begin(), parent.end(),
                  [](const std::string& entry) { return entry.rfind("OMP_NUM_THREADS=", 0) == 0; });
  if (!user_set_threads) {
    environment.push_back(fmt::format(
        "OMP_NUM_THREADS={}",
        default_omp_threads(options.nproc_per_node, std::thread::hardware_concurrency())));
  }
  return environment;
}

int default_omp_threads(int ranks_per_node, unsigned hardware_threads) {
  if (hardware_threads == 0 || ranks_per_node <= 0) return 1;
  return std::max(1, static_cast<int>(hardware_threads) / ranks_per_node);
}

std::vector<std::string> current_environment() {
  std::vector<std::string> entries;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    entries.emplace_back(*entry);
  }
  return entries;
}

}  // namespace loom::loomrun
