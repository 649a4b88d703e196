#include "base/profiler.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>

#include "base/error.h"

namespace loom::profiler {

namespace {

using Clock = std::chrono::steady_clock;

std::atomic<bool> is_enabled{false};
Options current_options;

struct Totals {
  int64_t calls = 0;
  double total_s = 0;
  double self_s = 0;
};

struct Table {
  std::mutex mutex;
  std::map<std::string, Totals, std::less<>> totals;
};

Table& table_instance() {
  static Table instance;
  return instance;
}

// This thread's open scopes: where each started and how much of it nested scopes took.
struct Frame {
  std::string_view name;
  Clock::time_point start;
  double children_s = 0;
};
thread_local std::vector<Frame> stack;

}  // namespace

void enable(Options options) {
  current_options = options;
  is_enabled.store(true, std::memory_order_relaxed);
}

void disable() { is_enabled.store(false, std::memory_order_relaxed); }

bool enabled() { return is_enabled.load(std::memory_order_relaxed); }

const Options& options() { return current_options; }

void reset() {
  Table& t = table_instance();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.totals.clear();
}

Options environment_options() {
  Options out;
  const char* value = std::getenv("LOOM_PROFILE");
  if (value == nullptr) return out;
  std::string_view rest(value);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view word = rest.substr(0, comma);
    if (word == "sync") {
      out.synchronize = true;
    } else if (word == "shapes") {
      out.by_shape = true;
    } else {
      LOOM_CHECK(word == "ops" || word == "1",
                 "LOOM_PROFILE='{}': '{}' is not a profiler setting (expected a comma-separated "
                 "list of 'ops', 'sync' and 'shapes')",
                 value, word);
    }
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  return out;
}

bool enable_from_environment() {
  const char* value = std::getenv("LOOM_PROFILE");
  if (value == nullptr || *value == '\0') return false;
  enable(environment_options());
  return true;
}

Scope::Scope(std::string_view name) : active_(enabled()) {
  if (active_) stack.push_back({name, Clock::now()});
}

Scope::~Scope() {
  if (!active_ || stack.empty()) return;
  const Frame frame = stack.back();
  stack.pop_back();
  const double elapsed = std::chrono::duration<double>(Clock::now() - frame.start).count();
  // Directly inside a scope of the same name (autograd recording an op, then running it below
  // autograd): one call, whose time the outer scope's total already holds.
  const bool repeat = !stack.empty() && stack.back().name == frame.name;
  if (!stack.empty()) stack.back().children_s += elapsed;
  Table& t = table_instance();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.totals.find(frame.name);
  if (it == t.totals.end()) it = t.totals.emplace(std::string(frame.name), Totals{}).first;
  it->second.self_s += elapsed - frame.children_s;
  if (!repeat) {
    it->second.calls += 1;
    it->second.total_s += elapsed;
  }
}

std::vector<Entry> entries() {
  std::vector<Entry> out;
  {
    Table& t = table_instance();
    std::lock_guard<std::mutex> lock(t.mutex);
    for (const auto& [name, totals] : t.totals)
      out.push_back({name, totals.calls, totals.total_s, totals.self_s});
  }
  std::sort(out.begin(), out.end(),
            [](const Entry& a, const Entry& b) { return a.self_s > b.self_s; });
  return out;
}

std::string table(size_t rows) {
  const std::vector<Entry> all = entries();
  double self_sum = 0;
  for (const Entry& e : all) self_sum += e.self_s;
  std::string out = fmt::format("{:<36} {:>9} {:>11} {:>7} {:>11} {:>12}\n", "op / scope", "calls",
                                "self ms", "self %", "total ms", "µs per call");
  const auto line = [&](const Entry& e) {
    out += fmt::format("{:<36} {:>9} {:>11.2f} {:>6.1f}% {:>11.2f} {:>12.2f}\n", e.name, e.calls,
                       1e3 * e.self_s, self_sum > 0 ? 100 * e.self_s / self_sum : 0.0,
                       1e3 * e.total_s, e.calls > 0 ? 1e6 * e.total_s / e.calls : 0.0);
  };
  Entry rest{.name = "(the rest)"};
  for (size_t i = 0; i < all.size(); ++i) {
    if (i < rows) {
      line(all[i]);
    } else {
      rest.calls += all[i].calls;
      rest.self_s += all[i].self_s;
      rest.total_s += all[i].total_s;
    }
  }
  if (all.size() > rows) line(rest);
  out += fmt::format("{:<36} {:>9} {:>11.2f}\n", "(self times summed)", "", 1e3 * self_sum);
  return out;
}

}  // namespace loom::profiler
