// write_loss_plot draws the PNG with gnuplot (./loom setup installs it) under any path a user
// gives: quotes, spaces and shell syntax in the folder or file name are part of the name, never a
// command (the plot was once drawn through a shell: a name could run one).
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

}  // namespace
}  // namespace loom::train
