#include "train/loss_plot.h"

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>

#include "train/output_files.h"

namespace loom::train {

std::string write_loss_plot(const std::vector<double>& losses, double entropy,
                            const std::string& png, const std::string& title) {
  const std::string data = png + ".dat", script = png + ".gnuplot";
  std::string points;
  for (size_t step = 0; step < losses.size(); ++step) {
    points += fmt::format("{} {}\n", step, losses[step]);
  }
  write_file(data, points, "--plot-out");
  write_file(script,
             fmt::format("set terminal pngcairo size 800,500\nset output '{}'\n"
                         "set xlabel 'step'\nset ylabel 'loss (nats)'\n"
                         "set title '{}' noenhanced\nset grid\n"
                         "plot '{}' using 1:2 with lines title 'loss', {} with lines "
                         "dashtype 2 title 'unigram entropy of the data'\n",
                         png, title, data, entropy),
             "--plot-out");
  const int status = std::system(fmt::format("gnuplot '{}' 2>/dev/null", script).c_str());
  if (status == 0 && std::filesystem::exists(png)) return fmt::format("loss curve: {}", png);
  return fmt::format(
      "loss curve: gnuplot failed or is missing (./loom setup installs it); the losses are in {}",
      data);
}

}  // namespace loom::train
