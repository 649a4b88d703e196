#include "comm/gloo/op_runner.h"

#include <pthread.h>
#include <signal.h>

#include "base/error.h"

namespace loom::comm::gloo_detail {

namespace {

// Thread names show up in debuggers and `top -H` ("gloo:tp", at most 15 characters).
void name_this_thread(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

// Gloo writes with writev(), which raises SIGPIPE (default action: kill the process) when the
// peer is gone. Operations run on these threads, so a dead peer must become an EPIPE error here
// (reported as a broken connection naming the rank), not the death of a survivor.
void block_sigpipe_on_this_thread() {
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
}

}  // namespace

OpRunner::OpRunner(std::string name) : name_(std::move(name)), worker_([this] { worker_loop(); }) {}

OpRunner::~OpRunner() { stop(); }

void OpRunner::enqueue(Job job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    LOOM_INTERNAL_ASSERT(!stopping_, "OpRunner '{}': enqueue after stop", name_);
    queue_.push_back(std::move(job));
  }
  wake_worker_.notify_one();
}

void OpRunner::run_concurrently(Job job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    LOOM_INTERNAL_ASSERT(!stopping_, "OpRunner '{}': run_concurrently after stop", name_);
    helper_jobs_.push_back(std::move(job));
    if (idle_helpers_ < static_cast<int>(helper_jobs_.size())) {
      helpers_.emplace_back([this] { helper_loop(); });
      ++idle_helpers_;  // counted idle until it takes a job
    }
  }
  wake_helpers_.notify_one();
}

void OpRunner::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ && !worker_.joinable()) return;
    stopping_ = true;
  }
  wake_worker_.notify_all();
  wake_helpers_.notify_all();
  if (worker_.joinable()) worker_.join();
  for (auto& helper : helpers_) {
    if (helper.joinable()) helper.join();
  }
}

void OpRunner::worker_loop() {
  name_this_thread("gloo:" + name_);
  block_sigpipe_on_this_thread();
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_worker_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping and drained
    Job job = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    job();          // jobs report their own errors through their Work
    job = nullptr;  // release captured tensors before sleeping
    lock.lock();
  }
}

void OpRunner::helper_loop() {
  name_this_thread("gloo-p2p:" + name_);
  block_sigpipe_on_this_thread();
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_helpers_.wait(lock, [&] { return stopping_ || !helper_jobs_.empty(); });
    if (helper_jobs_.empty()) return;
    Job job = std::move(helper_jobs_.front());
    helper_jobs_.pop_front();
    --idle_helpers_;
    lock.unlock();
    job();
    job = nullptr;
    lock.lock();
    ++idle_helpers_;
  }
}

}  // namespace loom::comm::gloo_detail
