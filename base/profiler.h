// An op-level timer, switchable at run time (torch.profiler's key_averages table, in miniature).
//
//   loom::profiler::enable();            // or LOOM_PROFILE=ops in the environment (loom_train:
//   ... run steps ...                    //   --profile-ops)
//   std::cout << loom::profiler::table();
//
// While enabled, every tensor op that runs its own kernel (tensor/dispatch.h) is timed under its
// name, and so is every named Scope the layers above open ("autograd::backward",
// "optimizer.step", "comm::all_reduce", ...; anyone may open one, as torch's record_function).
// Each entry has its calls, its total time (inclusive) and its self time (minus the time of the
// scopes nested in it), so self times add up to the wall time covered. A scope nested directly
// in one of the same name (autograd recording an op, then running it below autograd) counts
// once. Threads are timed separately and summed (ranks run as threads in the tests).
//
// Cost: disabled, one relaxed atomic load per op. Enabled, a clock read pair and a short
// critical section per op, plus the op's call record (~1 µs): small against the kernels of a
// real step, not against a tiny model's element-wise ops (say so when quoting figures).
//
// GPU ops are asynchronous: with Options::synchronize the tensor layer waits for the device at
// the end of each op, so its time is the kernel's (and the step runs slower for it).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom::profiler {

struct Options {
  bool synchronize = false;  // wait for the device at the end of each op (GPU attribution)
  // Ops timed per input signature ("copy_ f32(16, 1024, 768) bf16(16, 1024, 768)*", * for a
  // strided input) rather than per name: which calls of an op are the slow ones (torch's
  // group_by_input_shape).
  bool by_shape = false;
};

void enable(Options options = {});
void disable();
bool enabled();
const Options& options();
// Forgets every entry (keeps the enabled state).
void reset();
// LOOM_PROFILE's options: a comma-separated list of "ops" (or "1"), "sync"
// (Options::synchronize) and "shapes" (Options::by_shape); unset or empty: the defaults. Throws
// naming the value and the word it does not know.
Options environment_options();
// Enables the profiler with environment_options() when LOOM_PROFILE is set and not empty.
// Returns whether it did.
bool enable_from_environment();

// A timed range under `name` (a string with static storage, or one that outlives the profile:
// op names and literals).
class Scope {
 public:
  explicit Scope(std::string_view name);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  bool active_;
};

struct Entry {
  std::string name;
  int64_t calls = 0;
  double total_s = 0;  // inclusive of nested scopes
  double self_s = 0;   // exclusive
};

// Every entry, the largest self time first.
std::vector<Entry> entries();
// The entries as a table: name, calls, self ms, self %, total ms, per call µs; the first `rows`
// rows and a line for the rest.
std::string table(size_t rows = 30);

}  // namespace loom::profiler
