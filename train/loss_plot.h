// The loss curve as a PNG (gnuplot): its points and gnuplot script beside it, then gnuplot.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace loom::train {

struct LossCurve {
  std::vector<std::pair<int, double>> train;       // (step, loss) of every step run
  std::vector<std::pair<int, double>> validation;  // (step, loss) of every validation
};

// Writes `png`.dat (step, loss), `png`.val.dat (step, validation loss) when there is any, and
// `png`.gnuplot, then runs gnuplot to draw `png`: the training loss, the validation loss as
// points joined by a line, and the data's unigram entropy as a dashed line. A point file or
// script that cannot be written is an error naming it; a missing or failing gnuplot leaves the
// points and says so (returns the line to print).
std::string write_loss_plot(const LossCurve& curve, double entropy, const std::string& png,
                            const std::string& title);

// The files write_loss_plot writes for `png`: the PNG, its points, its validation points and
// its script (what no other output of the job may be).
struct LossPlotFiles {
  std::string png, points, validation_points, script;
};
LossPlotFiles loss_plot_files(const std::string& png);

}  // namespace loom::train
