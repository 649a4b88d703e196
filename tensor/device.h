// Where a tensor's storage lives.
#pragma once

#include <cstdint>
#include <string>

namespace loom {

// kMeta is torch's meta device: tensors with a shape, a dtype and strides but no values. Every op
// accepts them and makes meta outputs of the right shapes without running a kernel, so a whole
// training step can be traced (its allocations, collectives and FLOPs counted) at any model size;
// `loom plan` does that (train/job_plan.h). Storage of at most kMetaDataBytes (tensor/storage.h)
// keeps real, zeroed host bytes, so the small control values a job reads back (a scalar loss, a
// pipeline's shape message) still work; what an op computes into them stays zero.
enum class DeviceType : uint8_t { kCPU, kCUDA, kMeta };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;  // CUDA ordinal; always 0 for CPU and meta

  static Device cpu() { return {DeviceType::kCPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::kCUDA, index}; }
  static Device meta() { return {DeviceType::kMeta, 0}; }
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  bool is_meta() const { return type == DeviceType::kMeta; }
  bool operator==(const Device&) const = default;
  // "cpu", "cuda:1" or "meta".
  std::string str() const;
};

// The device the factories (ops::empty, zeros, ones, full, normal, uniform) use when the call
// names none: the CPU, unless a DefaultDeviceGuard on this thread says otherwise (torch's
// `with torch.device("meta"):`). How a model is built on the meta device with its own
// constructor: parameters are created there instead of on the CPU and moved.
Device default_device();

// The device whose kernels a meta op allocates like. Every device gives an op the same outputs,
// but their staging copies and temporaries differ: a CPU kernel computes bf16 in f32 copies and
// updates f32 in place, where a GPU kernel reads bf16 as it is and an in-place add makes a
// temporary. CUDA unless a MetaTargetGuard on this thread says otherwise; a trace of a CPU job
// sets the CPU (train/step_trace.h), so its memory is the CPU run's.
Device meta_target();

class MetaTargetGuard {
 public:
  explicit MetaTargetGuard(Device target);
  ~MetaTargetGuard();
  MetaTargetGuard(const MetaTargetGuard&) = delete;
  MetaTargetGuard& operator=(const MetaTargetGuard&) = delete;

 private:
  Device previous_;
};

// Whether an op on `device` takes the CPU kernels' allocations: the CPU, or meta targeting it.
inline bool allocates_like_cpu(Device device) {
  return device.is_cpu() || (device.is_meta() && meta_target().is_cpu());
}

class DefaultDeviceGuard {
 public:
  explicit DefaultDeviceGuard(Device device);
  ~DefaultDeviceGuard();
  DefaultDeviceGuard(const DefaultDeviceGuard&) = delete;
  DefaultDeviceGuard& operator=(const DefaultDeviceGuard&) = delete;

 private:
  Device previous_;
};

}  // namespace loom
