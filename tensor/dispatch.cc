#include "tensor/dispatch.h"

#include <mutex>
#include <unordered_map>

#include "base/error.h"

namespace loom {

namespace {

// Handlers by extension kind. Registration happens at set-up, lookups on every extended op;
// a small vector indexed by kind keeps the lookup lock-free after registration.
struct HandlerRegistry {
  std::mutex mutex;
  std::unordered_map<int, std::shared_ptr<const DispatchHandler>> handlers;
};

HandlerRegistry& registry() {
  static HandlerRegistry instance;
  return instance;
}

std::shared_ptr<const DispatchHandler> find_handler(int kind) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.handlers.find(kind);
  return it == r.handlers.end() ? nullptr : it->second;
}

template <typename Range>
std::optional<std::vector<Tensor>> dispatch_range(std::string_view op, const Range& inputs,
                                                  std::vector<OpAttr>& attrs) {
  const TensorExtension* extension = nullptr;
  for (const Tensor& t : inputs) {
    if (t.defined() && t.extension()) {
      extension = t.extension().get();
      break;
    }
  }
  if (extension == nullptr) return std::nullopt;
  auto handler = find_handler(extension->kind());
  LOOM_CHECK(handler != nullptr,
             "{}: an input carries a tensor extension of kind {} but no dispatch handler is "
             "registered for it",
             op, extension->kind());
  OpCall call{op, std::vector<Tensor>(inputs.begin(), inputs.end()), std::move(attrs)};
  return (*handler)(call);
}

}  // namespace

void register_dispatch_handler(int kind, DispatchHandler handler) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (handler) {
    r.handlers[kind] = std::make_shared<const DispatchHandler>(std::move(handler));
  } else {
    r.handlers.erase(kind);
  }
}

std::optional<std::vector<Tensor>> dispatch_extension(std::string_view op,
                                                      std::initializer_list<Tensor> inputs,
                                                      std::vector<OpAttr> attrs) {
  return dispatch_range(op, inputs, attrs);
}

std::optional<std::vector<Tensor>> dispatch_extension(std::string_view op,
                                                      std::span<const Tensor> inputs,
                                                      std::vector<OpAttr> attrs) {
  return dispatch_range(op, inputs, attrs);
}

}  // namespace loom
