#include "train/loss_plot.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>
#include <filesystem>

#include "train/output_files.h"

namespace loom::train {

namespace {

std::string points(const std::vector<std::pair<int, double>>& curve) {
  std::string out;
  for (const auto& [step, loss] : curve) out += fmt::format("{} {}\n", step, loss);
  return out;
}

// A string in gnuplot's single quotes: no substitution happens inside them, and a quote is
// written twice.
std::string quoted(const std::string& text) {
  std::string out = "'";
  for (const char c : text) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

// gnuplot on `script`, started without a shell (a path is an argument, never a command), its
// messages dropped. True when it ran and exited 0.
bool run_gnuplot(const std::string& script) {
  posix_spawn_file_actions_t actions;
  if (posix_spawn_file_actions_init(&actions) != 0) return false;
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  std::string program = "gnuplot", path = script;
  char* argv[] = {program.data(), path.data(), nullptr};
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, "gnuplot", &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) return false;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return false;
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

LossPlotFiles loss_plot_files(const std::string& png) {
  return {png, png + ".dat", png + ".val.dat", png + ".gnuplot"};
}

std::string write_loss_plot(const LossCurve& curve, double entropy, const std::string& png,
                            const std::string& title) {
  const LossPlotFiles files = loss_plot_files(png);
  const std::string &data = files.points, &val = files.validation_points, &script = files.script;
  // gnuplot gets absolute paths: a name starting with '|' (set output) or '<' (plot) would be a
  // command to it, and one starting with '-' an option; a path starting with '/' is neither.
  const auto absolute = [](const std::string& path) {
    return std::filesystem::absolute(path).lexically_normal().string();
  };
  write_file(data, points(curve.train), "--plot-out");
  std::string validation;
  if (!curve.validation.empty()) {
    write_file(val, points(curve.validation), "--plot-out");
    validation = fmt::format(", {} using 1:2 with linespoints title 'validation loss'",
                             quoted(absolute(val)));
  }
  write_file(script,
             fmt::format("set terminal pngcairo size 800,500\nset output {}\n"
                         "set xlabel 'step'\nset ylabel 'loss (nats)'\n"
                         "set title {} noenhanced\nset grid\n"
                         "plot {} using 1:2 with lines title 'loss'{}, {} with lines "
                         "dashtype 2 title 'unigram entropy of the data'\n",
                         quoted(absolute(png)), quoted(title), quoted(absolute(data)), validation,
                         entropy),
             "--plot-out");
  if (run_gnuplot(absolute(script)) && std::filesystem::exists(png)) {
    return fmt::format("loss curve: {}", png);
  }
  return fmt::format(
      "loss curve: gnuplot failed or is missing (./loom setup installs it); the losses are in {}",
      data);
}

}  // namespace loom::train
