#include "comm/init.h"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string_view>

#include "base/error.h"
#include "comm/flight_recorder.h"
#include "comm/gloo/process_group_gloo.h"
#include "comm/launch_env.h"
#include "comm/nccl/process_group_nccl.h"
#include "comm/prefix_store.h"

namespace loom::comm {

std::shared_ptr<ProcessGroup> init_process_group(const std::string& backend, InitOptions options) {
  LOOM_CHECK(backend == "gloo" || backend == "nccl",
             "init_process_group: unknown backend '{}' (expected \"gloo\" for CPU ranks or ranks "
             "sharing a GPU, or \"nccl\" for a GPU per rank)",
             backend);
  const Duration timeout = options.timeout.value_or(timeout_from_env());
  LOOM_CHECK(timeout > Duration::zero(), "init_process_group: the timeout must be positive");
  const LaunchEnv env = read_launch_env();
  // A launcher that collects flight-recorder dumps (loomrun) sets the folder: SIGTERM (how it
  // stops the other ranks when one fails) and SIGUSR1 then dump this rank's rings there.
  if (!flight_recorder::dump_dir().empty()) flight_recorder::install_signal_dumps();
  auto store = make_rendezvous_store(env, timeout);
  // A launcher that restarts the job (loomrun --max-restarts) keeps serving the same store: each
  // attempt rendezvouses under its own keys, never reading the last attempt's.
  const char* restart = std::getenv("LOOM_RESTART_COUNT");
  const std::string attempt =
      restart != nullptr && *restart != '\0' && std::string_view(restart) != "0"
          ? fmt::format("restart{}/", restart)
          : std::string();
  auto world_store = std::make_shared<PrefixStore>(attempt + "world/", store);
  ProcessGroupOptions group{.name = "default", .timeout = timeout};
  if (backend == "gloo") {
    GlooOptions gloo;
    gloo.device = options.gloo_device;
    return ProcessGroupGloo::create(world_store, env.rank, env.world_size, group, gloo);
  }
  const int device = options.device_index >= 0 ? options.device_index : env.local_rank;
  return ProcessGroupNccl::create(world_store, env.rank, env.world_size, group, device);
}

}  // namespace loom::comm
