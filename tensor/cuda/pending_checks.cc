#include "tensor/cuda/pending_checks.h"

#include <utility>

#include "base/error.h"

namespace loom::cuda {

PendingChecks::PendingChecks(int capacity) : capacity_(capacity) {
  LOOM_CHECK(capacity > 0, "PendingChecks: capacity must be positive, got {}", capacity);
  // Handed out from the back: slot 0 first.
  for (int slot = capacity - 1; slot >= 0; --slot) free_slots_.push_back(slot);
}

std::optional<int> PendingChecks::begin(Describe describe) {
  if (free_slots_.empty()) return std::nullopt;
  const int slot = free_slots_.back();
  free_slots_.pop_back();
  checks_.push_back({slot, std::move(describe)});
  return slot;
}

std::optional<PendingChecks::Failure> PendingChecks::take_failure(const int64_t* slots) {
  std::vector<Check> checks = std::move(checks_);
  checks_.clear();
  std::optional<Failure> first;
  for (Check& check : checks) {
    free_slots_.push_back(check.slot);
    const int64_t position = slots[check.slot];
    if (!first && position != kNoFailure) first = Failure{std::move(check.describe), position};
  }
  return first;
}

}  // namespace loom::cuda
