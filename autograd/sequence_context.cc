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

std::vector<PositionRun> sequence_runs(int64_t local_len) {
  const std::vector<int64_t> positions = sequence_positions(local_len);
  std::vector<PositionRun> runs;
  for (size_t begin = 0; begin < positions.size();) {
    size_t end = begin + 1;
    while (end < positions.size() && positions[end] == positions[end - 1] + 1) ++end;
    runs.push_back(
        {static_cast<int64_t>(begin), positions[begin], static_cast<int64_t>(end - begin)});
    begin = end;
  }
  return runs;
}

Tensor sequence_rows(const Tensor& table, int64_t local_len) {
  // Each run of consecutive positions is one narrow of the table.
  std::vector<Tensor> rows;
  for (const PositionRun& run : sequence_runs(local_len)) {
    LOOM_CHECK(run.global >= 0 && run.global + run.length <= table.size(0),
               "sequence_rows: positions {} to {}, but the table has {} rows", run.global,
               run.global + run.length - 1, table.size(0));
    rows.push_back(narrow(table, 0, run.global, run.length));
  }
  LOOM_CHECK(!rows.empty(), "sequence_rows: no positions for a sequence of {}", local_len);
  return rows.size() == 1 ? rows.front() : cat(rows, 0);
}

}  // namespace loom
