#include "autograd/sequence_context.h"

#include <numeric>

#include "autograd/functions.h"
#include "base/error.h"

namespace loom {

namespace {
thread_local SequenceContext* current = nullptr;
}  // namespace

SequenceContext* current_sequence_context() { return current; }

SequenceContextGuard::SequenceContextGuard(SequenceContext* context) : previous_(current) {
  current = context;
}

SequenceContextGuard::~SequenceContextGuard() { current = previous_; }

std::vector<int64_t> sequence_positions(int64_t local_len) {
  if (current != nullptr) return current->positions(local_len);
  std::vector<int64_t> out(static_cast<size_t>(local_len));
  std::iota(out.begin(), out.end(), int64_t{0});
  return out;
}

Tensor sequence_rows(const Tensor& table, int64_t local_len) {
  const std::vector<int64_t> positions = sequence_positions(local_len);
  // Runs of consecutive positions, each one narrow of the table.
  std::vector<Tensor> runs;
  for (size_t begin = 0; begin < positions.size();) {
    size_t end = begin + 1;
    while (end < positions.size() && positions[end] == positions[end - 1] + 1) ++end;
    LOOM_CHECK(positions[begin] >= 0 && positions[end - 1] < table.size(0),
               "sequence_rows: positions {} to {}, but the table has {} rows", positions[begin],
               positions[end - 1], table.size(0));
    runs.push_back(narrow(table, 0, positions[begin], static_cast<int64_t>(end - begin)));
    begin = end;
  }
  LOOM_CHECK(!runs.empty(), "sequence_rows: no positions for a sequence of {}", local_len);
  return runs.size() == 1 ? runs.front() : cat(runs, 0);
}

}  // namespace loom
