#include "tools/loomrun/rank_env.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

namespace loom::loomrun {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::Not;
using ::testing::Pair;

LaunchOptions two_nodes_of_four() {
  LaunchOptions options;
  options.nproc_per_node = 4;
  options.nnodes = 2;
  options.node_rank = 1;
  options.master_addr = "10.1.2.3";
  options.master_port = 29500;
  options.command = {"prog"};
  return options;
}

TEST(RankEnvTest, GlobalRankIsNodeRankTimesLocalWorldSizePlusLocalRank) {
  const LaunchOptions options = two_nodes_of_four();
  EXPECT_EQ(global_rank(options, 0), 4);
  EXPECT_EQ(global_rank(options, 3), 7);
  LaunchOptions single;
  single.nproc_per_node = 3;
  EXPECT_EQ(global_rank(single, 2), 2);
}

TEST(RankEnvTest, VariablesOfOneRank) {
  EXPECT_THAT(rank_variables(two_nodes_of_four(), 2, 29500),
              ElementsAre(Pair("RANK", "6"), Pair("WORLD_SIZE", "8"), Pair("LOCAL_RANK", "2"),
                          Pair("LOCAL_WORLD_SIZE", "4"), Pair("GROUP_RANK", "1"),
                          Pair("MASTER_ADDR", "10.1.2.3"), Pair("MASTER_PORT", "29500"),
                          Pair("LOOM_AGENT_STORE", "1")));
}

TEST(RankEnvTest, KeepsTheParentsVariablesAndReplacesStaleRankVariables) {
  const std::vector<std::string> parent = {"PATH=/usr/bin", "RANK=99",   "HOME=/root",
                                           "MASTER_PORT=1", "RANKING=x", "EMPTY="};
  LaunchOptions options;
  options.nproc_per_node = 2;
  options.command = {"prog"};
  const std::vector<std::string> environment = build_rank_environment(options, 1, 4321, parent);
  EXPECT_THAT(
      environment,
      ElementsAre("PATH=/usr/bin", "HOME=/root", "RANKING=x", "EMPTY=", "RANK=1", "WORLD_SIZE=2",
                  "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", "GROUP_RANK=0", "MASTER_ADDR=127.0.0.1",
                  "MASTER_PORT=4321", "LOOM_AGENT_STORE=1",
                  fmt::format("OMP_NUM_THREADS={}",
                              default_omp_threads(2, std::thread::hardware_concurrency()))));
  EXPECT_THAT(environment, Not(Contains("RANK=99")));
}

TEST(RankEnvTest, OmpThreadsDefaultToTheNodesThreadsPerRankUnlessSet) {
  EXPECT_EQ(default_omp_threads(4, 16), 4);
  EXPECT_EQ(default_omp_threads(4, 2), 1);  // more ranks than threads: still 1
  EXPECT_EQ(default_omp_threads(3, 8), 2);
  EXPECT_EQ(default_omp_threads(2, 0), 1);  // hardware unknown
  LaunchOptions options;
  options.nproc_per_node = 2;
  options.command = {"prog"};
  const auto environment = build_rank_environment(options, 0, 4321, {"OMP_NUM_THREADS=7"});
  EXPECT_THAT(environment, Contains("OMP_NUM_THREADS=7"));
  EXPECT_EQ(std::count_if(environment.begin(), environment.end(),
                          [](const std::string& e) { return e.rfind("OMP_NUM_THREADS=", 0) == 0; }),
            1);
}

TEST(RankEnvTest, CurrentEnvironmentSeesSetenv) {
  setenv("LOOMRUN_TEST_VARIABLE", "42", 1);
  EXPECT_THAT(current_environment(), Contains("LOOMRUN_TEST_VARIABLE=42"));
}

}  // namespace
}  // namespace loom::loomrun
