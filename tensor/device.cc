#include "tensor/device.h"

#include <fmt/format.h>

namespace loom {

std::string Device::str() const { return is_cpu() ? "cpu" : fmt::format("cuda:{}", index); }

}  // namespace loom
