#include "tensor/device.h"

#include <fmt/format.h>

namespace loom {

namespace {
thread_local Device default_device_of_thread = Device::cpu();
thread_local Device meta_target_of_thread = Device::cuda();
}  // namespace

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

Device meta_target() { return meta_target_of_thread; }

MetaTargetGuard::MetaTargetGuard(Device target) : previous_(meta_target_of_thread) {
  meta_target_of_thread = target;
}

MetaTargetGuard::~MetaTargetGuard() { meta_target_of_thread = previous_; }

DefaultDeviceGuard::DefaultDeviceGuard(Device device) : previous_(default_device_of_thread) {
  default_device_of_thread = device;
}

DefaultDeviceGuard::~DefaultDeviceGuard() { default_device_of_thread = previous_; }

}  // namespace loom
