#include "tensor/dispatch.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "base/error.h"
#include "base/profiler.h"
#include "tensor/cuda/stream.h"
#include "tensor/grad_mode.h"

namespace loom {

namespace {

// Handlers by extension kind. Registration happens at set-up, lookups on every extended op.
struct HandlerRegistry {
  std::mutex mutex;
  std::unordered_map<int, std::shared_ptr<const DispatchHandler>> handlers;
  // Bumped on every registration: a thread's cached lookup is valid while it is unchanged.
  std::atomic<uint64_t> version{0};
  // Handlers replaced or removed stay alive: a call already inside one (or a thread's cached
  // pointer) may still use it. Registrations are set-up time and few.
  std::vector<std::shared_ptr<const DispatchHandler>> retired;
};

HandlerRegistry& registry() {
  static HandlerRegistry instance;
  return instance;
}

// Constant-initialized: safe to set from another library's static initializer.
std::atomic<AutogradHandler> autograd_handler{nullptr};

// The handler of an extension kind. Every DTensor op asks, so each thread keeps its last answer
// (no lock, no reference-count traffic shared between rank threads) until a registration.
const DispatchHandler* find_handler(int kind) {
  struct Cached {
    uint64_t version = ~uint64_t{0};
    int kind = 0;
    const DispatchHandler* handler = nullptr;  // owned by the registry, never freed
  };
  thread_local Cached cached;
  auto& r = registry();
  const uint64_t version = r.version.load(std::memory_order_acquire);
  if (cached.version != version || cached.kind != kind) {
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.handlers.find(kind);
    cached = {r.version.load(std::memory_order_relaxed), kind,
              it == r.handlers.end() ? nullptr : it->second.get()};
  }
  return cached.handler;
}

// The op the profiler is running through call_op on this thread: its re-dispatch goes on to run
// it rather than timing it a second time.
thread_local std::optional<OpId> profiled_op;

// This thread's dispatch mode, and whether a call it was shown is running (what runs inside is
// not shown to it again).
thread_local DispatchMode* current_mode = nullptr;
thread_local bool inside_mode_call = false;

template <typename Range>
std::vector<Tensor> run_in_mode(OpId op, const Range& inputs, std::vector<OpAttr>& attrs) {
  OpCall call(op, std::vector<Tensor>(inputs.begin(), inputs.end()), std::move(attrs));
  struct Inside {
    Inside() { inside_mode_call = true; }
    ~Inside() { inside_mode_call = false; }
  } inside;
  return current_mode->dispatch(call);
}

// Times the op under its name (base/profiler.h): runs it through call_op, which dispatches it
// again from the top, where profiled_op lets it through.
// "copy_ f32(16, 1024, 768) bf16(16, 1024, 768)*": the op and its inputs' dtypes and shapes, *
// for a strided one (Options::by_shape).
template <typename Range>
std::string signature(OpId op, const Range& inputs) {
  std::string out(op_name(op));
  for (const Tensor& t : inputs) {
    if (!t.defined()) continue;
    out += fmt::format(" {}{}{}", dtype_name(t.dtype()), shape_str(t.shape()),
                       t.is_contiguous() ? "" : "*");
  }
  return out;
}

template <typename Range>
std::vector<Tensor> run_profiled(OpId op, const Range& inputs, std::vector<OpAttr>& attrs) {
  // The label outlives the scope that names it.
  const std::string label = profiler::options().by_shape ? signature(op, inputs) : std::string();
  profiler::Scope scope(label.empty() ? op_name(op) : std::string_view(label));
  OpCall call(op, std::vector<Tensor>(inputs.begin(), inputs.end()), std::move(attrs));
  struct Clear {
    ~Clear() { profiled_op.reset(); }
  } clear;
  profiled_op = op;
  std::vector<Tensor> out = call_op(call);
  if (profiler::options().synchronize) {
    // GPU kernels are asynchronous: the op's time is its kernels' once the device is done.
    // The first CUDA tensor among the inputs, else among the outputs.
    const auto on_cuda = [](const Tensor& t) { return t.defined() && t.device().is_cuda(); };
    for (const std::vector<Tensor>* list : {&call.inputs, &out}) {
      const auto it = std::find_if(list->begin(), list->end(), on_cuda);
      if (it == list->end()) continue;
      cuda::synchronize(it->device().index);
      break;
    }
  }
  return out;
}

template <typename Range>
std::optional<std::vector<Tensor>> dispatch_range(OpId op, const Range& inputs,
                                                  std::vector<OpAttr>& attrs) {
  const OpInfo& info = op_info(op);
  if (profiler::enabled()) [[unlikely]] {
    if (profiled_op != op) return run_profiled(op, inputs, attrs);
    profiled_op.reset();  // this is the profiled call itself: route it as usual
  }
  const bool recording = recording_enabled();
  bool needs_grad = false;
  const TensorExtension* extension = nullptr;
  for (const Tensor& t : inputs) {
    if (!t.defined()) continue;
    needs_grad = needs_grad || (recording && t.requires_grad());
    if (extension == nullptr && t.extension()) extension = t.extension().get();
  }
  if (needs_grad) {
    OpCall call(op, std::vector<Tensor>(inputs.begin(), inputs.end()), std::move(attrs));
    if (info.grad == OpGrad::kDifferentiable) {
      const AutogradHandler handler = autograd_handler.load(std::memory_order_acquire);
      LOOM_CHECK(handler != nullptr,
                 "{}: an input requires grad but autograd is not linked into this program; "
                 "depend on //autograd (or run the op under NoGradGuard)",
                 info.name);
      return handler(call);
    }
    // A no-grad op on inputs that require grad: its outputs do not, and nothing it calls on
    // the way may record either.
    BelowAutogradGuard below;
    return call_op(call);
  }
  if (current_mode != nullptr && !inside_mode_call) [[unlikely]] {
    return run_in_mode(op, inputs, attrs);
  }
  if (extension == nullptr || info.extensions == OpExtensions::kPlainOnly) return std::nullopt;
  auto handler = find_handler(extension->kind());
  LOOM_CHECK(handler != nullptr,
             "{}: an input carries a tensor extension of kind {} but no dispatch handler is "
             "registered for it",
             info.name, extension->kind());
  OpCall call(op, std::vector<Tensor>(inputs.begin(), inputs.end()), std::move(attrs));
  return (*handler)(call);
}

}  // namespace

ScopedDispatchMode::ScopedDispatchMode(DispatchMode& mode)
    : previous_(current_mode), previous_inside_(inside_mode_call) {
  current_mode = &mode;
  inside_mode_call = false;  // the new mode sees the calls from here on
}

ScopedDispatchMode::~ScopedDispatchMode() {
  current_mode = previous_;
  inside_mode_call = previous_inside_;
}

void register_dispatch_handler(int kind, DispatchHandler handler) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (auto it = r.handlers.find(kind); it != r.handlers.end()) {
    r.retired.push_back(std::move(it->second));
    r.handlers.erase(it);
  }
  if (handler) r.handlers[kind] = std::make_shared<const DispatchHandler>(std::move(handler));
  r.version.fetch_add(1, std::memory_order_release);
}

void register_autograd_handler(AutogradHandler handler) {
  autograd_handler.store(handler, std::memory_order_release);
}

bool autograd_handler_registered() {
  return autograd_handler.load(std::memory_order_acquire) != nullptr;
}

std::optional<std::vector<Tensor>> dispatch_op(OpId op, std::initializer_list<Tensor> inputs,
                                               std::vector<OpAttr> attrs) {
  return dispatch_range(op, inputs, attrs);
}

std::optional<std::vector<Tensor>> dispatch_op(OpId op, std::span<const Tensor> inputs,
                                               std::vector<OpAttr> attrs) {
  return dispatch_range(op, inputs, attrs);
}

std::optional<OpId> find_op(std::string_view name) {
  for (const OpInfo& info : all_ops()) {
    if (info.name == name) return info.id;
  }
  return std::nullopt;
}

}  // namespace loom
