#pragma once

#include <cstdint>
#include <optional>
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
  // Why the file's lines were dropped as another run's ("" when kept, or none were there).
  std::string dropped;
};

// The loss of the checkpoint's last step, as the job that saved it logged it (its metadata's
// extra "metrics"): how a resumed job knows its own run's lines from another's in a file that
// several runs share (the default --metrics-out is one name in the working folder).
struct SavedLoss {
  int64_t step = 0;
  double loss = 0;
};

// Reads `path`; no file (the first attempt) is an empty history. With `saved`, the lines are
// kept only when the file's line of saved->step holds that loss, bit for bit (the same run wrote
// both: JSON keeps a double's every bit); otherwise none is kept and `dropped` says why.
MetricsHistory read_metrics_before(const std::string& path, int64_t steps_done,
                                   const std::optional<SavedLoss>& saved = std::nullopt);

}  // namespace loom::train
