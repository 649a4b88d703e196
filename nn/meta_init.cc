#include "nn/meta_init.h"

#include <unordered_set>

#include "tensor/storage.h"

namespace loom::nn {

namespace {

// Never destroyed: a placeholder may be freed at any time after its build scope ended.
MemoryTracker& placeholder_tracker() {
  static MemoryTracker* tracker = new MemoryTracker();
  return *tracker;
}

}  // namespace

MetaBuildScope::MetaBuildScope() : device_(Device::meta()), placeholders_(placeholder_tracker()) {}

void materialize(Module& module, Device device) {
  std::unordered_set<const Storage*> done;
  for (const auto& [name, tensor] : module.state_dict()) {
    if (!tensor.defined()) continue;
    const std::shared_ptr<Storage>& storage = tensor.storage();
    if (!storage->device().is_meta() || !done.insert(storage.get()).second) continue;
    storage->materialize(device);
  }
}

bool has_meta_tensors(const Module& module) {
  for (const auto& [name, tensor] : module.state_dict()) {
    if (tensor.defined() && tensor.device().is_meta()) return true;
  }
  return false;
}

}  // namespace loom::nn
