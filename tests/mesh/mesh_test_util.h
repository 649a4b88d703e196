// Meshes over the harness's world group (comm/testing/multi_rank.h), for the mesh tests and the
// layers above (tests/dtensor, ...).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "mesh/device_mesh.h"

namespace loom::testing {

inline std::shared_ptr<const DeviceMesh> make_mesh(comm::ProcessGroup& world,
                                                   std::vector<std::string> names,
                                                   std::vector<int64_t> shape) {
  return std::make_shared<const DeviceMesh>(world.shared_from_this(), std::move(names),
                                            std::move(shape));
}

}  // namespace loom::testing
