#include "comm/init.h"

#include "base/error.h"
#include "comm/gloo/process_group_gloo.h"
#include "comm/launch_env.h"
#include "comm/nccl/process_group_nccl.h"
#include "comm/prefix_store.h"

namespace loom::comm {

std::shared_ptr<ProcessGroup> init_process_group(const std::string& backend, InitOptions options) {
  LOOM_CHECK(backend == "gloo" || backend == "nccl",
             "init_process_group: unknown backend '{}' (expected \"gloo\" for CPU ranks or "
             "\"nccl\" for GPU ranks)",
             backend);
  const LaunchEnv env = read_launch_env();
  auto store = make_rendezvous_store(env, options.timeout);
  auto world_store = std::make_shared<PrefixStore>("world/", store);
  ProcessGroupOptions group{.name = "default", .timeout = options.timeout};
  if (backend == "gloo") {
    return ProcessGroupGloo::create(world_store, env.rank, env.world_size, group);
  }
  const int device = options.device_index >= 0 ? options.device_index : env.local_rank;
  return ProcessGroupNccl::create(world_store, env.rank, env.world_size, group, device);
}

}  // namespace loom::comm
