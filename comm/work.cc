#include "comm/work.h"

#include "base/profiler.h"

namespace loom::comm {

void Work::wait() {
  profiler::Scope scope("comm::wait");  // the caller blocked on a collective or a message
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [&] { return completed_; });
  if (error_) std::rethrow_exception(error_);
}

bool Work::is_completed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

std::exception_ptr Work::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

std::vector<Tensor> Work::result() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return result_;
}

void Work::on_done(std::function<void(const std::exception_ptr&)> callback) {
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!completed_) {
      done_callbacks_.push_back(std::move(callback));
      return;
    }
    error = error_;
  }
  callback(error);
}

void Work::run_done_callbacks() {
  std::vector<std::function<void(const std::exception_ptr&)>> callbacks;
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    callbacks.swap(done_callbacks_);
    error = error_;
  }
  for (const auto& callback : callbacks) callback(error);
}

void Work::mark_completed(std::vector<Tensor> result) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    result_ = std::move(result);
    completed_ = true;
  }
  done_cv_.notify_all();
  run_done_callbacks();
}

void Work::mark_failed(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = error;
    completed_ = true;
  }
  done_cv_.notify_all();
  run_done_callbacks();
}

}  // namespace loom::comm
