#include "comm/testing/multi_rank.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/in_memory_store.h"

namespace loom::comm::testing {

namespace {

// Shared by the caller and the rank threads; the threads own a reference, so a rank that must
// be left behind never touches freed harness state.
struct Run {
  std::function<void(ProcessGroup&)> body;
  MultiRankOptions options;
  int world = 0;
  std::shared_ptr<InMemoryStore> store = std::make_shared<InMemoryStore>();
  std::source_location location;

  std::mutex mutex;
  std::condition_variable finished_cv;
  std::vector<bool> finished;
  int finished_count = 0;
  std::vector<std::weak_ptr<ProcessGroupGloo>> groups;
  struct Failure {
    int rank;
    std::string message;
  };
  std::vector<Failure> failures;  // in the order they happened
};

std::string first_line(const std::string& text, size_t limit = 300) {
  std::string line = text.substr(0, text.find('\n'));
  if (line.size() > limit) line = line.substr(0, limit) + "...";
  return line;
}

void run_rank(const std::shared_ptr<Run>& run, int rank) {
  ::testing::ScopedTrace trace(run->location.file_name(), static_cast<int>(run->location.line()),
                               fmt::format("rank {}", rank));
  // Sees fatal failures (ASSERT_*) of this thread only, and forwards them to gtest; the helper
  // behind ASSERT_NO_FATAL_FAILURE.
  ::testing::internal::HasNewFatalFailureHelper fatal_failures;
  std::shared_ptr<ProcessGroupGloo> group;
  std::string error;
  try {
    group = ProcessGroupGloo::create(
        run->store, rank, run->world,
        ProcessGroupOptions{.name = run->options.group_name, .timeout = run->options.timeout},
        run->options.gloo);
    {
      std::lock_guard<std::mutex> lock(run->mutex);
      run->groups[rank] = group;
    }
    run->body(*group);
  } catch (const std::exception& e) {
    error = e.what();
  } catch (...) {
    error = "a non-standard exception";
  }
  if (!error.empty()) {
    {
      std::lock_guard<std::mutex> lock(run->mutex);
      run->failures.push_back({rank, error});
    }
    if (group) group->abort(fmt::format("rank {} threw: {}", rank, first_line(error)));
  } else if (fatal_failures.has_new_fatal_failure() && group) {
    group->abort(fmt::format("rank {} stopped after a fatal test failure", rank));
  }
  group.reset();  // runs what is queued, joins the group's threads
  {
    std::lock_guard<std::mutex> lock(run->mutex);
    run->finished[rank] = true;
    ++run->finished_count;
  }
  run->finished_cv.notify_all();
}

std::vector<int> unfinished(const Run& run) {
  std::vector<int> ranks;
  for (int r = 0; r < run.world; ++r) {
    if (!run.finished[r]) ranks.push_back(r);
  }
  return ranks;
}

}  // namespace

void run_on_ranks(int world_size, const std::function<void(ProcessGroup& pg)>& body,
                  MultiRankOptions options, std::source_location location) {
  const char* file = location.file_name();
  const int line = static_cast<int>(location.line());
  if (world_size < 1) {
    ADD_FAILURE_AT(file, line) << "run_on_ranks: world_size must be at least 1, got " << world_size;
    return;
  }
  auto run = std::make_shared<Run>();
  run->body = body;
  run->options = options;
  run->world = world_size;
  run->location = location;
  run->finished.assign(world_size, false);
  run->groups.resize(world_size);
  run->store->set_timeout(options.timeout);

  std::vector<std::thread> threads;
  threads.reserve(world_size);
  for (int r = 0; r < world_size; ++r) threads.emplace_back([run, r] { run_rank(run, r); });

  std::unique_lock<std::mutex> lock(run->mutex);
  const auto all_done = [&] { return run->finished_count == world_size; };
  if (!run->finished_cv.wait_for(lock, options.deadline, all_done)) {
    const std::vector<int> late = unfinished(*run);
    ADD_FAILURE_AT(file, line) << fmt::format(
        "run_on_ranks: ranks [{}] still running after the deadline of {} ms; aborting their groups",
        fmt::join(late, ", "), options.deadline.count());
    std::vector<std::shared_ptr<ProcessGroupGloo>> to_abort;
    for (int r : late) {
      if (auto group = run->groups[r].lock()) to_abort.push_back(std::move(group));
    }
    lock.unlock();
    for (auto& group : to_abort) group->abort("run_on_ranks: the deadline passed");
    to_abort.clear();
    lock.lock();
    run->finished_cv.wait_for(lock, options.timeout + std::chrono::seconds(1), all_done);
  }
  const std::vector<int> stuck = unfinished(*run);
  const std::vector<Run::Failure> failures = run->failures;
  lock.unlock();

  for (int r = 0; r < world_size; ++r) {
    if (std::find(stuck.begin(), stuck.end(), r) != stuck.end()) {
      threads[r].detach();
    } else {
      threads[r].join();
    }
  }
  for (const auto& failure : failures) {
    ADD_FAILURE_AT(file, line) << "rank " << failure.rank << ": " << failure.message;
  }
  if (!stuck.empty()) {
    ADD_FAILURE_AT(file, line) << fmt::format(
        "run_on_ranks: ranks [{}] did not return even after their groups were aborted (stuck "
        "outside "
        "communication?); their threads are detached and left running",
        fmt::join(stuck, ", "));
  }
}

std::vector<std::string> intercept_failures(const std::function<void()>& body) {
  ::testing::TestPartResultArray results;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ALL_THREADS, &results);
    body();
  }
  std::vector<std::string> messages;
  for (int i = 0; i < results.size(); ++i)
    messages.push_back(results.GetTestPartResult(i).message());
  return messages;
}

}  // namespace loom::comm::testing
