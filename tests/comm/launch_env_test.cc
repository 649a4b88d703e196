// read_launch_env: torchrun, OpenMPI and Slurm variables, the single-process defaults, and
// every missing/contradictory case with its message; make_rendezvous_store over loopback.
#include "comm/launch_env.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "base/error.h"
#include "comm/peer_failure.h"
#include "comm/tcp_store_server.h"
#include "tests/comm/tcp_test_util.h"

namespace loom::comm::testing {
namespace {

using ::testing::HasSubstr;
using Env = std::map<std::string, std::string>;

GetEnv from(const Env& env) {
  return [env](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}

std::string error_of(const Env& env) {
  try {
    read_launch_env(from(env));
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "read_launch_env accepted the environment";
  return "";
}

void expect_env(const LaunchEnv& env, int rank, int world, int local_rank, int local_world,
                const std::string& addr, int port, const std::string& source) {
  EXPECT_EQ(env.rank, rank);
  EXPECT_EQ(env.world_size, world);
  EXPECT_EQ(env.local_rank, local_rank);
  EXPECT_EQ(env.local_world_size, local_world);
  EXPECT_EQ(env.master_addr, addr);
  EXPECT_EQ(env.master_port, port);
  EXPECT_EQ(env.source, source);
}

const Env kMaster = {{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}};

Env with(Env base, const Env& extra) {
  for (const auto& [k, v] : extra) base[k] = v;
  return base;
}

// A rank's exit status says whose failure it was: a peer's (3), the user's input that the same
// command would meet again (2: launchers do not restart it), or its own (1).
TEST(LaunchEnvTest, ExitStatusByKindOfError) {
  EXPECT_EQ(exit_status_for(PeerFailure("rank 1 left")), kExitPeerFailed);
  EXPECT_EQ(exit_status_for(InputError("--checkpoint-dir: in use")), kExitBadInput);
  EXPECT_EQ(exit_status_for(Error("a bad shape")), kExitFailed);
  EXPECT_EQ(exit_status_for(std::runtime_error("other")), kExitFailed);
}

TEST(LaunchEnvTest, Torchrun) {
  const LaunchEnv env = read_launch_env(from(
      with(kMaster,
           {{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}})));
  expect_env(env, 5, 8, 1, 4, "10.0.0.1", 29500, "torchrun");
  EXPECT_EQ(to_string(env), "rank 5/8 (local 1/4) via torchrun, master 10.0.0.1:29500");
}

TEST(LaunchEnvTest, TorchrunWithoutLocalVariablesMeansOneNode) {
  expect_env(read_launch_env(from(with(kMaster, {{"RANK", "2"}, {"WORLD_SIZE", "4"}}))), 2, 4, 2, 4,
             "10.0.0.1", 29500, "torchrun");
}

TEST(LaunchEnvTest, OneProcessNeedsNoMaster) {
  expect_env(read_launch_env(from({{"RANK", "0"}, {"WORLD_SIZE", "1"}})), 0, 1, 0, 1, "127.0.0.1",
             0, "torchrun");
}

TEST(LaunchEnvTest, OpenMpiFallback) {
  const Env env = with(kMaster, {{"OMPI_COMM_WORLD_RANK", "3"},
                                 {"OMPI_COMM_WORLD_SIZE", "4"},
                                 {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  expect_env(read_launch_env(from(env)), 3, 4, 1, 2, "10.0.0.1", 29500, "openmpi");
}

TEST(LaunchEnvTest, TorchrunAndOpenMpiAgreeing) {
  const Env env = with(kMaster, {{"RANK", "3"},
                                 {"WORLD_SIZE", "4"},
                                 {"OMPI_COMM_WORLD_RANK", "3"},
                                 {"OMPI_COMM_WORLD_SIZE", "4"}});
  expect_env(read_launch_env(from(env)), 3, 4, 3, 4, "10.0.0.1", 29500, "torchrun");
}

TEST(LaunchEnvTest, SlurmFallbackWithNtasksPerNode) {
  const Env env = with(kMaster, {{"SLURM_PROCID", "6"},
                                 {"SLURM_NTASKS", "8"},
                                 {"SLURM_LOCALID", "2"},
                                 {"SLURM_NTASKS_PER_NODE", "4"}});
  expect_env(read_launch_env(from(env)), 6, 8, 2, 4, "10.0.0.1", 29500, "slurm");
}

TEST(LaunchEnvTest, SlurmLocalSizeDerivedFromTasksPerNode) {
  // Nodes 0-2 run 2 tasks each, node 3 runs 1.
  const Env base = with(kMaster, {{"SLURM_NTASKS", "7"}, {"SLURM_TASKS_PER_NODE", "2(x3),1"}});
  expect_env(read_launch_env(from(with(
                 base, {{"SLURM_PROCID", "6"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "3"}}))),
             6, 7, 0, 1, "10.0.0.1", 29500, "slurm");
  expect_env(read_launch_env(from(with(
                 base, {{"SLURM_PROCID", "3"}, {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "1"}}))),
             3, 7, 1, 2, "10.0.0.1", 29500, "slurm");
  EXPECT_THAT(
      error_of(with(base, {{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "4"}})),
      HasSubstr("SLURM_NODEID=4 is beyond the 4 nodes of SLURM_TASKS_PER_NODE=2(x3),1"));
  EXPECT_THAT(error_of(with(base, {{"SLURM_PROCID", "0"},
                                   {"SLURM_LOCALID", "0"},
                                   {"SLURM_NODEID", "0"},
                                   {"SLURM_TASKS_PER_NODE", "2(y3)"}})),
              HasSubstr("SLURM_TASKS_PER_NODE=2(y3) is not a list like '4(x2),3'"));
}

TEST(LaunchEnvTest, TorchrunTakesPrecedenceOverSlurm) {
  // srun starting one torchrun per node: workers see their node's SLURM_PROCID.
  const Env env = with(kMaster, {{"RANK", "5"},
                                 {"WORLD_SIZE", "8"},
                                 {"LOCAL_RANK", "1"},
                                 {"LOCAL_WORLD_SIZE", "4"},
                                 {"SLURM_PROCID", "1"},
                                 {"SLURM_NTASKS", "2"},
                                 {"SLURM_LOCALID", "0"}});
  expect_env(read_launch_env(from(env)), 5, 8, 1, 4, "10.0.0.1", 29500, "torchrun");
}

TEST(LaunchEnvTest, NothingSet) {
  const std::string message = error_of({});
  EXPECT_THAT(message, HasSubstr("read_launch_env: no launcher variables are set"));
  EXPECT_THAT(message, HasSubstr("found none of RANK, WORLD_SIZE"));
  EXPECT_THAT(message, HasSubstr("need RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT"));
  EXPECT_THAT(message, HasSubstr("RANK=0 WORLD_SIZE=1"));
}

TEST(LaunchEnvTest, RankWithoutWorldSize) {
  const std::string message = error_of(with(kMaster, {{"RANK", "1"}}));
  EXPECT_THAT(message, HasSubstr("RANK is set but WORLD_SIZE is missing (torchrun variables)"));
  EXPECT_THAT(message, HasSubstr("found RANK=1, MASTER_ADDR=10.0.0.1, MASTER_PORT=29500"));
  EXPECT_THAT(message, HasSubstr("need both RANK and WORLD_SIZE"));
}

TEST(LaunchEnvTest, WorldSizeWithoutRank) {
  EXPECT_THAT(error_of(with(kMaster, {{"WORLD_SIZE", "2"}})),
              HasSubstr("WORLD_SIZE is set but RANK is missing"));
  EXPECT_THAT(
      error_of(with(kMaster, {{"OMPI_COMM_WORLD_SIZE", "2"}})),
      HasSubstr(
          "OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is missing (openmpi variables)"));
}

TEST(LaunchEnvTest, RankNotBelowWorldSize) {
  const std::string message = error_of(with(kMaster, {{"RANK", "4"}, {"WORLD_SIZE", "4"}}));
  EXPECT_THAT(message, HasSubstr("RANK=4 is not below WORLD_SIZE=4"));
  EXPECT_THAT(message,
              HasSubstr("found RANK=4, WORLD_SIZE=4, MASTER_ADDR=10.0.0.1, MASTER_PORT=29500"));
  EXPECT_THAT(message, HasSubstr("need 0 <= RANK < WORLD_SIZE"));
}

TEST(LaunchEnvTest, NonNumericValues) {
  EXPECT_THAT(error_of(with(kMaster, {{"RANK", "one"}, {"WORLD_SIZE", "2"}})),
              HasSubstr("RANK=one is not a non-negative integer"));
  EXPECT_THAT(error_of(with(kMaster, {{"RANK", "1"}, {"WORLD_SIZE", "2x"}})),
              HasSubstr("WORLD_SIZE=2x is not a non-negative integer"));
  EXPECT_THAT(error_of(with(kMaster, {{"RANK", "-1"}, {"WORLD_SIZE", "2"}})),
              HasSubstr("RANK=-1 is not a non-negative integer"));
  EXPECT_THAT(
      error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "http"}}),
      HasSubstr("MASTER_PORT=http is not a non-negative integer"));
  EXPECT_THAT(error_of({{"RANK", "0"}, {"WORLD_SIZE", "0"}}),
              HasSubstr("WORLD_SIZE=0 is not a positive number"));
}

TEST(LaunchEnvTest, LocalVariables) {
  EXPECT_THAT(error_of(with(kMaster, {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}})),
              HasSubstr("LOCAL_RANK is set but LOCAL_WORLD_SIZE is missing"));
  EXPECT_THAT(
      error_of(with(
          kMaster,
          {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}})),
      HasSubstr("local rank 2 is not below the local world size 2"));
  EXPECT_THAT(
      error_of(with(
          kMaster,
          {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "3"}})),
      HasSubstr("local world size 3 is not in 1..WORLD_SIZE=2"));
}

TEST(LaunchEnvTest, TorchrunAndOpenMpiDisagreeing) {
  const std::string message = error_of(with(kMaster, {{"RANK", "1"},
                                                      {"WORLD_SIZE", "4"},
                                                      {"OMPI_COMM_WORLD_RANK", "2"},
                                                      {"OMPI_COMM_WORLD_SIZE", "4"}}));
  EXPECT_THAT(
      message,
      HasSubstr("torchrun and OpenMPI variables disagree: RANK=1 but OMPI_COMM_WORLD_RANK=2"));
  EXPECT_THAT(message,
              HasSubstr("found RANK=1, WORLD_SIZE=4, MASTER_ADDR=10.0.0.1, MASTER_PORT=29500, "
                        "OMPI_COMM_WORLD_RANK=2, OMPI_COMM_WORLD_SIZE=4"));
  EXPECT_THAT(
      error_of(with(kMaster, {{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_SIZE", "8"}})),
      HasSubstr("WORLD_SIZE=4 but OMPI_COMM_WORLD_SIZE=8"));
}

TEST(LaunchEnvTest, SlurmMissingPieces) {
  EXPECT_THAT(
      error_of(with(
          kMaster, {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_NTASKS_PER_NODE", "2"}})),
      HasSubstr("SLURM_PROCID is set but SLURM_LOCALID is missing"));
  const std::string message = error_of(
      with(kMaster, {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "1"}}));
  EXPECT_THAT(message, HasSubstr("cannot tell how many tasks run on this node"));
  EXPECT_THAT(message,
              HasSubstr("need SLURM_NTASKS_PER_NODE, or SLURM_TASKS_PER_NODE with SLURM_NODEID"));
}

TEST(LaunchEnvTest, MasterAddressAndPort) {
  EXPECT_THAT(
      error_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}}),
      HasSubstr("MASTER_ADDR is not set (WORLD_SIZE=2 processes); found RANK=1, WORLD_SIZE=2, "
                "MASTER_PORT=29500; need MASTER_ADDR and MASTER_PORT"));
  EXPECT_THAT(error_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}),
              HasSubstr("MASTER_PORT is not set (WORLD_SIZE=2 processes)"));
  EXPECT_THAT(
      error_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "0"}}),
      HasSubstr("MASTER_PORT=0 cannot be found by the other ranks"));
  EXPECT_THAT(
      error_of(
          {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}}),
      HasSubstr("MASTER_PORT=70000 is not a TCP port"));
  EXPECT_THAT(
      error_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", ""}, {"MASTER_PORT", "1"}}),
      HasSubstr("MASTER_ADDR is empty"));
}

TEST(LaunchEnvTest, RendezvousStoreForOneProcess) {
  LaunchEnv env = read_launch_env(from({{"RANK", "0"}, {"WORLD_SIZE", "1"}}));
  auto store = make_rendezvous_store(env, std::chrono::seconds(5));
  store->set("k", "v");
  EXPECT_EQ(store->get_string("k"), "v");
}

TEST(LaunchEnvTest, RendezvousStoreAcrossRanksInThreads) {
  constexpr int kRanks = 3;
  const std::string port = std::to_string(free_loopback_port());
  std::vector<std::string> seen(kRanks);
  std::vector<std::thread> ranks;
  // Highest rank first: the clients start before rank 0's server and retry.
  for (int r = kRanks - 1; r >= 0; --r) {
    ranks.emplace_back([&, r] {
      const LaunchEnv env = read_launch_env(from({{"RANK", std::to_string(r)},
                                                  {"WORLD_SIZE", "3"},
                                                  {"MASTER_ADDR", "127.0.0.1"},
                                                  {"MASTER_PORT", port}}));
      auto store = make_rendezvous_store(env, std::chrono::seconds(20));
      store->set("rank/" + std::to_string(r), "here");
      store->wait({"rank/0", "rank/1", "rank/2"});
      seen[r] = store->get_string("rank/" + std::to_string((r + 1) % kRanks));
      store->add("done", 1);
      if (r == 0) {  // rank 0 serves: it leaves last
        store->wait({"done"});
        while (store->get_string("done") != "3")
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(seen[r], "here");
}

TEST(LaunchEnvTest, AgentStoreFlag) {
  const Env base = {
      {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}};
  EXPECT_FALSE(read_launch_env(from(base)).agent_store);
  Env agent = base;
  agent["LOOM_AGENT_STORE"] = "1";
  EXPECT_TRUE(read_launch_env(from(agent)).agent_store);
  agent["LOOM_AGENT_STORE"] = "yes";
  EXPECT_THAT(error_of(agent), HasSubstr("LOOM_AGENT_STORE=yes is neither 0 nor 1"));
}

// With LOOM_AGENT_STORE=1 the launcher serves the store and rank 0 is a client: rank 0 leaves
// first, and rank 1 still reads what rank 0 wrote.
TEST(LaunchEnvTest, AgentStoreOutlivesRankZero) {
  TcpStoreServer launcher({.bind_host = "127.0.0.1", .port = 0});
  const std::string port = std::to_string(launcher.port());
  auto env_of = [&](int rank) {
    return read_launch_env(from({{"RANK", std::to_string(rank)},
                                 {"WORLD_SIZE", "2"},
                                 {"MASTER_ADDR", "127.0.0.1"},
                                 {"MASTER_PORT", port},
                                 {"LOOM_AGENT_STORE", "1"}}));
  };
  {
    auto rank0 = make_rendezvous_store(env_of(0), std::chrono::seconds(5));
    rank0->set("from/0", "bye");
  }  // rank 0 is gone
  auto rank1 = make_rendezvous_store(env_of(1), std::chrono::seconds(5));
  EXPECT_EQ(rank1->get_string("from/0"), "bye");
}

TEST(LaunchEnvTest, RendezvousStoreRejectsAnUnusableEnv) {
  LaunchEnv env;
  env.rank = 2;
  env.world_size = 2;
  EXPECT_THAT([&] { make_rendezvous_store(env, std::chrono::seconds(1)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("rank 2 is not in 0..1")));
  env.rank = 1;
  env.master_port = 0;
  EXPECT_THAT(
      [&] { make_rendezvous_store(env, std::chrono::seconds(1)); },
      ::testing::ThrowsMessage<Error>(HasSubstr("master_port 0 is not usable for 2 ranks")));
}

}  // namespace
}  // namespace loom::comm::testing
