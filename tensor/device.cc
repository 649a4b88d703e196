#include "tensor/device.h"

#include <fmt/format.h>

namespace loom {

namespace {
thread_local Device default_device_of_thread = Device::cpu();
}

std::string Device::str() const {
  switch (type) {
    case DeviceType::kCPU:
      return "cpu";
    case DeviceType::kMeta:
      return "meta";
    case DeviceType::kCUDA:
      break;
  }
  return fmt::format("cuda:{}", index);
}

Device default_device() { return default_device_of_thread; }

DefaultDeviceGuard::DefaultDeviceGuard(Device device) : previous_(default_device_of_thread) {
  default_device_of_thread = device;
}

DefaultDeviceGuard::~DefaultDeviceGuard() { default_device_of_thread = previous_; }

}  // namespace loom
