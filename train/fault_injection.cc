#include "train/fault_injection.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "base/error.h"

namespace loom::train {

std::optional<InjectedFault> injected_fault_from_env() {
  const char* value = std::getenv("LOOM_INJECT_FAULT");
  if (value == nullptr || *value == '\0') return std::nullopt;
  long long rank = -1, step = -1;
  char tail = 0;
  LOOM_CHECK(std::sscanf(value, "rank=%lld,step=%lld%c", &rank, &step, &tail) == 2 && rank >= 0 &&
                 step >= 0,
             "LOOM_INJECT_FAULT: expected \"rank=R,step=S\" (non-negative numbers), got '{}'",
             value);
  return InjectedFault{rank, step};
}

void maybe_inject_fault(const std::optional<InjectedFault>& fault, int64_t rank, int64_t step) {
  if (fault && fault->rank == rank && fault->step == step) {
    LOOM_FAIL("injected fault at step {} on rank {} (LOOM_INJECT_FAULT)", step, rank);
  }
}

}  // namespace loom::train
