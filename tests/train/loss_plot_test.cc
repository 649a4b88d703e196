// write_loss_plot draws the PNG with gnuplot (./loom setup installs it) under any path a user
// gives: quotes, spaces, shell syntax and gnuplot's own pipes ('|cmd', '<cmd') in the folder or
// file name are part of the name, never a command (the plot was once drawn through a shell, and
// then given relative names gnuplot could read as pipes).
#include "train/loss_plot.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

namespace loom::train {
namespace {

namespace fs = std::filesystem;

TEST(LossPlotTest, AnyPathIsANameNotACommand) {
  const fs::path root = fs::path(std::getenv("TEST_TMPDIR")) / "plots";
  fs::remove_all(root);
  const fs::path folder = root / "bob's runs; touch INJECTED";
  fs::create_directories(folder);
  const std::string png = (folder / "x';touch INJECTED;'$(touch INJECTED).png").string();
  const LossCurve curve{.train = {{0, 5.0}, {1, 4.5}, {2, 4.2}}, .validation = {{2, 4.4}}};
  fs::current_path(root);  // where a shell's `touch INJECTED` would leave its file

  const std::string line = write_loss_plot(curve, 3.9, png, "it's a 'title'; touch INJECTED");

  EXPECT_EQ(line, "loss curve: " + png);
  ASSERT_TRUE(fs::exists(png)) << png;
  EXPECT_GT(fs::file_size(png), 1000u) << "a drawn PNG";
  for (const fs::path& where : {root, folder}) {
    EXPECT_FALSE(fs::exists(where / "INJECTED")) << where;
  }
  EXPECT_TRUE(fs::exists(png + ".dat"));
  EXPECT_TRUE(fs::exists(png + ".val.dat"));
}

// gnuplot's own commands in a name: '|cmd' as the output pipes the PNG into a shell, '<cmd' as
// the points reads them from one, '-x' would be an option. Relative names, as a user gives them.
TEST(LossPlotTest, GnuplotsPipesInANameAreNames) {
  const fs::path root = fs::path(std::getenv("TEST_TMPDIR")) / "gnuplot_names";
  fs::remove_all(root);
  fs::create_directories(root);
  fs::current_path(root);
  const LossCurve curve{.train = {{0, 5.0}, {1, 4.5}}};
  for (const std::string png : {"|touch INJECTED_OUT #", "<touch INJECTED_IN #", "-persist.png"}) {
    const std::string line = write_loss_plot(curve, 3.9, png, "names");
    EXPECT_EQ(line, "loss curve: " + png);
    EXPECT_TRUE(fs::exists(root / png)) << png;
  }
  EXPECT_FALSE(fs::exists(root / "INJECTED_OUT"));
  EXPECT_FALSE(fs::exists(root / "INJECTED_IN"));
}

}  // namespace
}  // namespace loom::train
