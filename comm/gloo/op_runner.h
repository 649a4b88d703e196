// OpRunner: the threads a Gloo process group runs its operations on (private to comm/gloo).
//
// One worker thread runs enqueued jobs one at a time in order (collectives). Helper threads run
// jobs concurrently (send/recv, whose completion may depend on later operations); a helper is
// started when none is idle, so there are as many as there were point-to-point ops in flight at
// once, and they are reused.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace loom::comm::gloo_detail {

class OpRunner {
 public:
  using Job = std::function<void()>;

  explicit OpRunner(std::string name);
  // = stop().
  ~OpRunner();
  OpRunner(const OpRunner&) = delete;
  OpRunner& operator=(const OpRunner&) = delete;

  // Runs `job` on the worker after every job enqueued before it.
  void enqueue(Job job);
  // Runs `job` on a helper thread now.
  void run_concurrently(Job job);
  // Runs every job already given (jobs must end on their own: each op has a deadline), then
  // joins all threads. Idempotent.
  void stop();

 private:
  void worker_loop();
  void helper_loop();

  std::string name_;
  std::mutex mutex_;
  std::condition_variable wake_worker_;
  std::condition_variable wake_helpers_;
  std::deque<Job> queue_;
  std::deque<Job> helper_jobs_;
  int idle_helpers_ = 0;
  bool stopping_ = false;
  std::thread worker_;
  std::vector<std::thread> helpers_;
};

}  // namespace loom::comm::gloo_detail
