// A fault probe for tests and tools of fault tolerance: LOOM_INJECT_FAULT="rank=R,step=S" makes
// global rank R throw at the start of step S — on every attempt, so a restarted job fails at the
// same step again (what loomrun's repeated-failure stop is tested with). Unset: nothing.
#pragma once

#include <cstdint>
#include <optional>

namespace loom::train {

struct InjectedFault {
  int64_t rank = 0;
  int64_t step = 0;
};

// LOOM_INJECT_FAULT parsed; throws loom::Error naming the value when it is malformed.
std::optional<InjectedFault> injected_fault_from_env();

// Throws loom::Error("injected fault ...") when `fault` is for this rank and step.
void maybe_inject_fault(const std::optional<InjectedFault>& fault, int64_t rank, int64_t step);

}  // namespace loom::train
