// The loss curve as a PNG (gnuplot): its points and gnuplot script beside it, then gnuplot.
#pragma once

#include <string>
#include <vector>

namespace loom::train {

// Writes `png`.dat (step, loss) and `png`.gnuplot, then runs gnuplot to draw `png` with the
// data's unigram entropy as a dashed line. A point file or script that cannot be written is an
// error naming it; a missing or failing gnuplot leaves the points and says so (returns the line
// to print).
std::string write_loss_plot(const std::vector<double>& losses, double entropy,
                            const std::string& png, const std::string& title);

}  // namespace loom::train
