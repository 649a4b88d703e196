// Whether ops record autograd graphs. Thread-local, like torch.no_grad(): each rank thread has
// its own. It lives in the tensor layer because every dispatched op asks it (tensor/dispatch.h):
// an op records when grad mode is on, no BelowAutogradGuard is active and an input requires grad.
#pragma once

namespace loom {

class GradMode {
 public:
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

// Disables recording for its scope (and restores the previous mode on exit).
class NoGradGuard {
 public:
  NoGradGuard() : previous_(GradMode::is_enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Enables recording for its scope, whatever the caller's mode (torch.enable_grad): what an
// activation checkpoint's recompute runs under inside a backward (which runs under no-grad).
class EnableGradGuard {
 public:
  EnableGradGuard() : previous_(GradMode::is_enabled()) { GradMode::set_enabled(true); }
  ~EnableGradGuard() { GradMode::set_enabled(previous_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool previous_;
};

// Marks the thread as running an op's own computation on behalf of autograd (torch's
// AutoDispatchBelowAutograd): ops dispatched inside it go straight to their extension handler or
// kernel without recording, while grad mode itself stays on. Autograd's dispatch sets it around
// an op's forward, then records that op once, with its formula.
class BelowAutogradGuard {
 public:
  BelowAutogradGuard();
  ~BelowAutogradGuard();
  BelowAutogradGuard(const BelowAutogradGuard&) = delete;
  BelowAutogradGuard& operator=(const BelowAutogradGuard&) = delete;
  static bool active();

 private:
  bool previous_;
};

// True when an op dispatched now would record: grad mode on and no BelowAutogradGuard active.
inline bool recording_enabled() { return GradMode::is_enabled() && !BelowAutogradGuard::active(); }

}  // namespace loom
