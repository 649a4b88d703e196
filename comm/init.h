// init_process_group: the one call a launched program makes (torch.distributed's
// init_process_group). Reads the launcher's environment (comm/launch_env.h: torchrun, mpirun or
// srun variables), rendezvouses through a TcpStore served by rank 0 at MASTER_ADDR:MASTER_PORT,
// and builds the world group on the chosen backend.
//
//   auto world = comm::init_process_group("gloo");
//   world->all_reduce(t)->wait();
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "comm/launch_env.h"  // timeout_from_env
#include "comm/process_group.h"

namespace loom::comm {

struct InitOptions {
  std::optional<Duration> timeout;  // nullopt: timeout_from_env()
  // CUDA device for "nccl" (default: LOCAL_RANK).
  int device_index = -1;
  // Where a "gloo" world's tensors live: the CPU, or a GPU that several ranks share (its tensors
  // staged through host memory: GlooOptions::device).
  Device gloo_device = Device::cpu();
};

// backend: "gloo" (CPU, or a GPU several ranks share: InitOptions::gloo_device) or "nccl" (a GPU
// per rank). Throws naming the backend when unknown, and the
// environment problem when variables are missing or contradictory.
std::shared_ptr<ProcessGroup> init_process_group(const std::string& backend,
                                                 InitOptions options = {});

}  // namespace loom::comm
