#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/loss_plot.h"

namespace loom::train {

// What a resumed job keeps of an earlier attempt's --metrics-out: the lines of the steps its
// checkpoint already holds (step < steps_done), training and validation alike, so that after a
// restart (loomrun --max-restarts) or --resume the file and the loss plot cover the whole run,
// not only the last attempt. Lines of steps the resumed job runs again are dropped (it writes
// them anew), as is a line cut short by a kill (it does not parse).
struct MetricsHistory {
  std::vector<std::string> lines;  // in the file's order
  LossCurve curve;                 // their training and validation points
};

// Reads `path`; no file (the first attempt) is an empty history.
MetricsHistory read_metrics_before(const std::string& path, int64_t steps_done);

}  // namespace loom::train
