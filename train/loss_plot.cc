#include "train/loss_plot.h"

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>

#include "train/output_files.h"

namespace loom::train {

namespace {

std::string points(const std::vector<std::pair<int, double>>& curve) {
  std::string out;
  for (const auto& [step, loss] : curve) out += fmt::format("{} {}\n", step, loss);
  return out;
}

}  // namespace

std::string write_loss_plot(const LossCurve& curve, double entropy, const std::string& png,
                            const std::string& title) {
  const std::string data = png + ".dat", val = png + ".val.dat", script = png + ".gnuplot";
  write_file(data, points(curve.train), "--plot-out");
  std::string validation;
  if (!curve.validation.empty()) {
    write_file(val, points(curve.validation), "--plot-out");
    validation = fmt::format(", '{}' using 1:2 with linespoints title 'validation loss'", val);
  }
  write_file(script,
             fmt::format("set terminal pngcairo size 800,500\nset output '{}'\n"
                         "set xlabel 'step'\nset ylabel 'loss (nats)'\n"
                         "set title '{}' noenhanced\nset grid\n"
                         "plot '{}' using 1:2 with lines title 'loss'{}, {} with lines "
                         "dashtype 2 title 'unigram entropy of the data'\n",
                         png, title, data, validation, entropy),
             "--plot-out");
  const int status = std::system(fmt::format("gnuplot '{}' 2>/dev/null", script).c_str());
  if (status == 0 && std::filesystem::exists(png)) return fmt::format("loss curve: {}", png);
  return fmt::format(
      "loss curve: gnuplot failed or is missing (./loom setup installs it); the losses are in {}",
      data);
}

}  // namespace loom::train
