#include "comm/flight_recorder.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/error.h"
#include "base/logging.h"

namespace loom::comm {

namespace {

double seconds_now() {
  static const auto epoch = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch).count();
}

std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

}  // namespace

std::string_view record_state_name(RecordState state) {
  switch (state) {
    case RecordState::kPending:
      return "pending";
    case RecordState::kCompleted:
      return "completed";
    case RecordState::kFailed:
      return "failed";
  }
  return "?";
}

namespace {

// This process's count of recorders made so far (GroupRecords::created).
int64_t next_created() {
  static std::atomic<int64_t> count{0};
  return count.fetch_add(1);
}

}  // namespace

FlightRecorder::FlightRecorder(std::string name, int rank, int size, std::vector<int> global_ranks,
                               size_t capacity)
    : name_(std::move(name)),
      rank_(rank),
      size_(size),
      global_ranks_(std::move(global_ranks)),
      capacity_(std::max<size_t>(capacity, 1)),
      created_(next_created()) {
  ring_.reserve(capacity_);
}

uint64_t FlightRecorder::record(uint64_t sequence, int64_t collective, CollectiveKind kind,
                                std::string detail) {
  FlightRecord entry{.sequence = sequence,
                     .collective = collective,
                     .kind = kind,
                     .detail = std::move(detail),
                     .issued_s = seconds_now()};
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t handle = next_handle_++;
  if (ring_.size() < capacity_) {
    ring_.push_back(std::move(entry));
  } else {
    ring_[handle % capacity_] = std::move(entry);
  }
  return handle;
}

void FlightRecorder::finish(uint64_t handle, const std::exception_ptr& error) {
  std::string message = error ? message_of(error) : std::string();
  const double now = seconds_now();
  std::lock_guard<std::mutex> lock(mutex_);
  if (handle + capacity_ < next_handle_) return;  // evicted
  FlightRecord& entry = ring_[handle % capacity_];
  entry.state = error ? RecordState::kFailed : RecordState::kCompleted;
  entry.ended_s = now;
  entry.error = std::move(message);
}

GroupRecords FlightRecorder::snapshot() const {
  GroupRecords out{name_, rank_, size_, global_ranks_, {}, created_};
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t count = std::min<uint64_t>(next_handle_, capacity_);
  for (uint64_t h = next_handle_ - count; h < next_handle_; ++h) {
    out.records.push_back(ring_[h % capacity_]);
  }
  return out;
}

size_t FlightRecorder::capacity_from_env() {
  const char* value = std::getenv("LOOM_FLIGHT_RECORDER_ENTRIES");
  if (value == nullptr || *value == '\0') return 2000;
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(value, &end, 10);
  // The ring is allocated whole per group: beyond 10 million entries (gigabytes) is a typo.
  constexpr long long kMost = 10'000'000;
  LOOM_CHECK(end != value && *end == '\0' && n >= 0 && n <= kMost && errno != ERANGE,
             "LOOM_FLIGHT_RECORDER_ENTRIES must be a number of entries from 0 (off) to {}, got "
             "'{}'",
             kMost, value);
  return static_cast<size_t>(n);
}

namespace flight_recorder {

namespace {

// One dump at a time in a process: the signal watcher's, a failure's and the exit's write the same
// rank-N.json.tmp (two at once had renamed each other's file away and left a torn one). Never
// destroyed: the exit's dump keeps it locked for good, so the detached watcher cannot dump while
// the process's statics are being destroyed.
std::mutex& dump_lock() {
  static std::mutex* const lock = new std::mutex;
  return *lock;
}

struct Registry {
  std::mutex mutex;
  std::vector<std::weak_ptr<FlightRecorder>> live;
  std::deque<std::pair<int, GroupRecords>> retired;  // (global rank, last snapshot)
  std::string dir;
  bool dir_set = false;
  std::atomic<bool> dumped_on_failure{false};
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: dumps may run while statics go away
  return *r;
}

constexpr size_t kRetiredKept = 64;

nlohmann::json to_json(const GroupRecords& group) {
  nlohmann::json records = nlohmann::json::array();
  for (const FlightRecord& r : group.records) {
    nlohmann::json entry{{"seq", r.sequence},
                         {"collective", r.collective},
                         {"op", std::string(collective_name(r.kind))},
                         {"detail", r.detail},
                         {"state", std::string(record_state_name(r.state))},
                         {"issued_s", r.issued_s},
                         {"ended_s", r.ended_s}};
    if (!r.error.empty()) entry["error"] = r.error;
    records.push_back(std::move(entry));
  }
  return {{"name", group.name},       {"rank", group.rank},
          {"size", group.size},       {"global_ranks", group.global_ranks},
          {"created", group.created}, {"records", std::move(records)}};
}

}  // namespace

void add(const std::shared_ptr<FlightRecorder>& recorder) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::erase_if(r.live, [](const auto& weak) { return weak.expired(); });
  r.live.push_back(recorder);
}

void retire(const FlightRecorder& recorder) {
  GroupRecords last = recorder.snapshot();
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.retired.emplace_back(recorder.global_rank(), std::move(last));
  while (r.retired.size() > kRetiredKept) r.retired.pop_front();
}

std::vector<std::pair<int, std::vector<GroupRecords>>> collect() {
  std::vector<std::shared_ptr<FlightRecorder>> live;
  std::map<int, std::vector<GroupRecords>> by_rank;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    for (const auto& weak : r.live) {
      if (auto recorder = weak.lock()) live.push_back(std::move(recorder));
    }
    for (const auto& [rank, group] : r.retired) by_rank[rank].push_back(group);
  }
  for (const auto& recorder : live)
    by_rank[recorder->global_rank()].push_back(recorder->snapshot());
  return {by_rank.begin(), by_rank.end()};
}

namespace {

std::vector<std::string> dump_locked(const std::string& dir, const std::string& reason) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  LOOM_CHECK(!error, "flight recorder: cannot create the dump folder '{}': {}", dir,
             error.message());
  std::vector<std::string> written;
  for (const auto& [rank, groups] : collect()) {
    nlohmann::json out{{"rank", rank},
                       {"pid", static_cast<int64_t>(::getpid())},
                       {"reason", reason},
                       {"dumped_s", seconds_now()},
                       {"groups", nlohmann::json::array()}};
    for (const GroupRecords& group : groups) out["groups"].push_back(to_json(group));
    const std::string path = fmt::format("{}/rank-{}.json", dir, rank);
    const std::string temporary = path + ".tmp";
    {
      std::ofstream file(temporary, std::ios::trunc);
      LOOM_CHECK(file.good(), "flight recorder: cannot write '{}'", temporary);
      file << out.dump(1) << "\n";
      LOOM_CHECK(file.good(), "flight recorder: writing '{}' failed", temporary);
    }
    std::filesystem::rename(temporary, path, error);
    LOOM_CHECK(!error, "flight recorder: cannot rename '{}' to '{}': {}", temporary, path,
               error.message());
    written.push_back(path);
  }
  return written;
}

}  // namespace

std::vector<std::string> dump(const std::string& dir, const std::string& reason) {
  std::lock_guard<std::mutex> lock(dump_lock());
  return dump_locked(dir, reason);
}

std::string dump_dir() {
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    if (r.dir_set) return r.dir;
  }
  const char* value = std::getenv("LOOM_FLIGHT_RECORDER_DIR");
  return value != nullptr ? std::string(value) : std::string();
}

void set_dump_dir(const std::string& dir) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.dir = dir;
  r.dir_set = true;
  r.dumped_on_failure = false;
}

void on_failure(const std::exception_ptr& error) {
  const std::string dir = dump_dir();
  if (dir.empty() || registry().dumped_on_failure.exchange(true)) return;
  try {
    dump(dir, "failure: " + message_of(error));
  } catch (const std::exception& e) {
    LOOM_LOG(warn, "flight recorder: the dump after a failure was not written: {}", e.what());
  }
}

namespace {

int g_signal_pipe[2] = {-1, -1};
struct sigaction g_previous_term {};

void on_dump_signal(int signal) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(signal);
  [[maybe_unused]] const ssize_t n = ::write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

void watch_signals() {
  for (;;) {
    unsigned char byte = 0;
    const ssize_t n = ::read(g_signal_pipe[0], &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    const int signal = byte;
    const std::string dir = dump_dir();
    if (!dir.empty()) {
      try {
        dump(dir, signal == SIGTERM ? "SIGTERM" : "SIGUSR1 (on request)");
      } catch (const std::exception& e) {
        LOOM_LOG(warn, "flight recorder: the dump on signal {} was not written: {}", signal,
                 e.what());
      }
    }
    if (signal == SIGTERM) {
      // Give SIGTERM back to what had it before (the default ends the process with it).
      ::sigaction(SIGTERM, &g_previous_term, nullptr);
      ::raise(SIGTERM);
    }
  }
}

}  // namespace

void install_signal_dumps() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (::pipe2(g_signal_pipe, O_CLOEXEC) != 0) {
      LOOM_LOG(warn, "flight recorder: no signal dumps (pipe failed)");
      return;
    }
    struct sigaction ours {};
    ours.sa_handler = on_dump_signal;
    sigemptyset(&ours.sa_mask);
    ours.sa_flags = SA_RESTART;
    struct sigaction current {};
    ::sigaction(SIGTERM, nullptr, &current);
    // An ignored SIGTERM stays ignored (nohup): only SIGUSR1 dumps then.
    if (!((current.sa_flags & SA_SIGINFO) == 0 && current.sa_handler == SIG_IGN)) {
      g_previous_term = current;
      ::sigaction(SIGTERM, &ours, nullptr);
    }
    ::sigaction(SIGUSR1, &ours, nullptr);
    std::thread(watch_signals).detach();
    // A rank that exits while its peers still run (having skipped what they wait in) must be in
    // the report too: every rank dumps at exit (its groups' last snapshots are kept).
    std::atexit([] {
      // Held for good: after this, statics are destroyed, and the watcher must not dump.
      dump_lock().lock();
      const std::string dir = dump_dir();
      if (dir.empty() || registry().dumped_on_failure.load()) return;
      try {
        dump_locked(dir, "exit");
      } catch (const std::exception&) {
        // exiting anyway: the job's own status says what happened
      }
    });
  });
}

}  // namespace flight_recorder
}  // namespace loom::comm
