#include "comm/fake/fake_world.h"

#include <fmt/format.h>

#include "base/error.h"
#include "tensor/grad_mode.h"
#include "tensor/memory_stats.h"
#include "tensor/ops.h"

namespace loom::comm {

void copy_values(const Tensor& into, const Tensor& message) {
  if (into.shape() != message.shape() || into.dtype() != message.dtype()) return;
  NoGradGuard no_grad;
  ops::copy_uncounted_(into, message);
}

void FakeRecvWork::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  LOOM_CHECK(done_cv_.wait_for(lock, timeout_, [&] { return completed_; }),
             "{}: no matching send within {} ms: the traced ranks' sends and receives do not "
             "pair up",
             description_, std::chrono::duration_cast<std::chrono::milliseconds>(timeout_).count());
  if (error_) std::rethrow_exception(error_);
}

void FakeWorld::send(const std::string& group, int src, int dst, int tag, const Tensor& tensor) {
  PendingRecv receiver;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const Key key{group, src, dst, tag};
    auto it = waiting_.find(key);
    if (it == waiting_.end() || it->second.empty()) {
      // Queued as a copy charged to no traced rank: holding the sender's own tensor until the
      // recv comes would add it to the sender's traced peak or not depending on which thread
      // ran first, and a trace must not depend on its threads' timing (the search compares
      // layouts' peaks to the byte).
      ScopedMemoryTracker in_flight(in_flight_);
      NoGradGuard no_grad;
      sent_[key].push_back(ops::clone(tensor));
      return;
    }
    receiver = std::move(it->second.front());
    it->second.pop_front();
  }
  copy_values(receiver.into, tensor);
  receiver.work->mark_completed();
}

void FakeWorld::recv(const std::string& group, int src, int dst, int tag, const Tensor& into,
                     std::shared_ptr<Work> work) {
  Tensor message;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!aborted_.empty()) {
      work->mark_failed(std::make_exception_ptr(Error(aborted_)));
      return;
    }
    const Key key{group, src, dst, tag};
    auto it = sent_.find(key);
    if (it == sent_.end() || it->second.empty()) {
      waiting_[key].push_back({into, std::move(work)});
      return;
    }
    message = std::move(it->second.front());
    it->second.pop_front();
  }
  copy_values(into, message);
  work->mark_completed();
}

std::vector<std::string> FakeWorld::unmatched() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> out;
  for (const auto& [key, messages] : sent_) {
    if (messages.empty()) continue;
    const auto& [group, src, dst, tag] = key;
    out.push_back(
        fmt::format("group '{}': {} send{} from rank {} to rank {} (tag {}) never received", group,
                    messages.size(), messages.size() == 1 ? "" : "s", src, dst, tag));
  }
  for (const auto& [key, receivers] : waiting_) {
    if (receivers.empty()) continue;
    const auto& [group, src, dst, tag] = key;
    out.push_back(fmt::format("group '{}': {} recv{} on rank {} from rank {} (tag {}) never sent",
                              group, receivers.size(), receivers.size() == 1 ? "" : "s", dst, src,
                              tag));
  }
  return out;
}

void FakeWorld::abort(const std::string& reason) {
  std::map<Key, std::deque<PendingRecv>> waiting;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!aborted_.empty()) return;
    aborted_ = reason;
    waiting.swap(waiting_);
  }
  for (auto& [key, receivers] : waiting) {
    for (PendingRecv& receiver : receivers) {
      receiver.work->mark_failed(std::make_exception_ptr(Error(reason)));
    }
  }
}

}  // namespace loom::comm
