#include "base/interrupt_cleanup.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

namespace loom::detail {
namespace {

// A slot is filled while kClaimed and touched by the handler only when kActive; the handler holds
// it in kRemoving while it unlinks, so its owner never frees (and refills) a slot being read.
enum State : int { kFree, kClaimed, kActive, kRemoving, kRemoved };
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs lock-free atomics");

constexpr int kSlots = 64;  // temporary files protected at once

struct Slot {
  std::atomic<int> state{kFree};
  std::atomic<int> signal{0};  // what removed the file (kRemoved)
  pid_t owner = 0;             // a forked child must not remove its parent's files
  char path[PATH_MAX];
};
Slot g_slots[kSlots];

constexpr int kSignals[] = {SIGINT, SIGTERM};
constexpr int kSignalCount = 2;
struct sigaction g_previous[kSignalCount];  // what each signal did before the handler
std::atomic<bool> g_installed[kSignalCount];
std::mutex g_install_mutex;

int signal_index(int signal) { return signal == SIGINT ? 0 : 1; }

void remove_registered_files(int signal) {
  const pid_t self = getpid();
  for (Slot& slot : g_slots) {
    if (slot.state.load(std::memory_order_acquire) != kActive || slot.owner != self) continue;
    int expected = kActive;
    if (!slot.state.compare_exchange_strong(expected, kRemoving)) continue;
    unlink(slot.path);
    slot.signal.store(signal);
    slot.state.store(kRemoved, std::memory_order_release);
  }
}

void on_signal(int signal, siginfo_t*, void*) {
  const int saved_errno = errno;
  remove_registered_files(signal);
  // Give the signal back to what had it: the default action (the process dies of the signal, so
  // its exit status is what it would have been) or the previous handler. The re-raised signal is
  // blocked until this handler returns, then delivered to that disposition.
  const int i = signal_index(signal);
  sigaction(signal, &g_previous[i], nullptr);
  g_installed[i].store(false);  // the next registration installs the handler again
  raise(signal);
  errno = saved_errno;
}

bool is_ours(const struct sigaction& action) {
  return (action.sa_flags & SA_SIGINFO) != 0 && action.sa_sigaction == on_signal;
}

void install_handlers() {
  for (int i = 0; i < kSignalCount; ++i) {
    if (g_installed[i].load(std::memory_order_acquire)) continue;
    std::lock_guard lock(g_install_mutex);
    if (g_installed[i].load()) continue;
    struct sigaction current {};
    if (sigaction(kSignals[i], nullptr, &current) != 0) continue;
    // An ignored signal ends nothing (nohup, a shell's background job): it stays ignored.
    if ((current.sa_flags & SA_SIGINFO) == 0 && current.sa_handler == SIG_IGN) continue;
    if (!is_ours(current)) {
      g_previous[i] = current;
      struct sigaction ours {};
      ours.sa_sigaction = on_signal;
      // SA_RESTART as before, so a blocking call the previous handler expects to be interrupted
      // (EINTR) still is.
      ours.sa_flags = SA_SIGINFO | (current.sa_flags & SA_RESTART);
      sigemptyset(&ours.sa_mask);
      for (int s : kSignals) sigaddset(&ours.sa_mask, s);  // one cleanup at a time
      if (sigaction(kSignals[i], &ours, nullptr) != 0) continue;
    }
    g_installed[i].store(true, std::memory_order_release);
  }
}

}  // namespace

InterruptCleanup::InterruptCleanup(const std::string& path) {
  install_handlers();
  std::error_code error;
  const std::string absolute = std::filesystem::absolute(path, error).string();
  if (error || absolute.size() >= PATH_MAX) return;
  for (int i = 0; i < kSlots; ++i) {
    Slot& slot = g_slots[i];
    int expected = kFree;
    if (!slot.state.compare_exchange_strong(expected, kClaimed)) continue;
    std::memcpy(slot.path, absolute.c_str(), absolute.size() + 1);
    slot.owner = getpid();
    slot.signal.store(0);
    slot.state.store(kActive, std::memory_order_release);
    slot_ = i;
    return;
  }
}

int InterruptCleanup::removed_by_signal() const {
  if (slot_ < 0) return 0;
  const Slot& slot = g_slots[slot_];
  int state;
  while ((state = slot.state.load(std::memory_order_acquire)) == kRemoving) {
    std::this_thread::yield();  // a handler on another thread is unlinking
  }
  return state == kRemoved ? slot.signal.load() : 0;
}

void InterruptCleanup::release() {
  if (slot_ < 0) return;
  Slot& slot = g_slots[slot_];
  for (;;) {
    int state = slot.state.load(std::memory_order_acquire);
    if (state == kRemoving) {
      std::this_thread::yield();  // a handler on another thread is reading the path
      continue;
    }
    if (slot.state.compare_exchange_weak(state, kFree)) break;
  }
  slot_ = -1;
}

}  // namespace loom::detail
