// Failure handling of ProcessGroupGloo: ranks that throw, vanish or never arrive, timeouts,
// poisoning, abort, destruction with peers gone, LOOM_DEBUG=collectives mismatches. Every
// failure must be an error naming the group, the op and the missing ranks — never a hang.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "base/error.h"
#include "comm/gloo/process_group_gloo.h"
#include "comm/in_memory_store.h"
#include "comm/peer_failure.h"
#include "comm/testing/multi_rank.h"
#include "tensor/ops.h"

namespace loom::comm {
namespace {

using ::testing::HasSubstr;
using testing::intercept_failures;
using testing::MultiRankOptions;
using ::testing::Not;
using testing::run_on_ranks;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

int64_t ms_since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

// Collects what each rank caught, and how long its failing call took.
struct Caught {
  std::mutex mutex;
  std::map<int, std::string> message;
  std::map<int, int64_t> elapsed_ms;
  std::map<int, bool> by_peer;  // whether it was a PeerFailure (another rank's doing)
  void record(int rank, const std::string& what, int64_t ms) {
    std::lock_guard<std::mutex> lock(mutex);
    message[rank] = what;
    elapsed_ms[rank] = ms;
  }
  void record(int rank, const Error& error, int64_t ms) {
    record(rank, std::string(error.what()), ms);
    std::lock_guard<std::mutex> lock(mutex);
    by_peer[rank] = is_peer_failure(error);
  }
};

MultiRankOptions with_timeout(Duration timeout) {
  MultiRankOptions options;
  options.timeout = timeout;
  return options;
}

TEST(FaultsTest, RankThatThrowsMakesOthersFailFastNamingIt) {
  Caught caught;
  const auto failures = intercept_failures([&] {
    run_on_ranks(3, [&](ProcessGroup& pg) {
      pg.barrier()->wait();
      if (pg.rank() == 1) throw std::runtime_error("boom");
      Tensor t = ops::ones({16});
      const auto start = Clock::now();
      try {
        pg.all_reduce(t)->wait();
      } catch (const Error& e) {
        caught.record(pg.rank(), e, ms_since(start));
      }
    });  // default group timeout: 10 s
  });
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_THAT(failures[0], HasSubstr("rank 1: boom"));
  for (int rank : {0, 2}) {
    SCOPED_TRACE(rank);
    const std::string& message = caught.message[rank];
    EXPECT_THAT(message, HasSubstr("all_reduce #1 (sum, f32, 16 elements) on group 'default'"));
    EXPECT_THAT(message, HasSubstr("ranks [1] did not arrive at this all_reduce"));
    EXPECT_THAT(message, HasSubstr("rank 1 left the group: aborted: rank 1 threw: boom"));
    EXPECT_LT(caught.elapsed_ms[rank], 3000) << "must fail fast, not wait out the 10 s timeout";
    EXPECT_TRUE(caught.by_peer[rank]) << "rank 1's failure, not this rank's: a PeerFailure";
  }
}

// Context added to a failure keeps whose doing it was (a pipeline naming its action does this).
TEST(FaultsTest, ContextKeepsWhetherAPeerCausedTheFailure) {
  try {
    throw_in_context(PeerFailure("the connection to rank 1 broke"), "action 3 failed: ...");
  } catch (const Error& e) {
    EXPECT_TRUE(is_peer_failure(e));
    EXPECT_STREQ(e.what(), "action 3 failed: ...");
  }
  try {
    throw_in_context(std::runtime_error("bad shape"), "action 3 failed: bad shape");
  } catch (const Error& e) {
    EXPECT_FALSE(is_peer_failure(e));
    EXPECT_STREQ(e.what(), "action 3 failed: bad shape");
  }
}

TEST(FaultsTest, TimeoutNamesTheRankThatNeverArrivedThenTheGroupIsPoisoned) {
  Caught caught;
  Caught poisoned;
  run_on_ranks(
      3,
      [&](ProcessGroup& pg) {
        pg.barrier()->wait();  // #0
        if (pg.rank() == 2) {
          std::this_thread::sleep_for(1500ms);  // alive, but never calls all_reduce #1
          return;
        }
        Tensor t = ops::ones({4});
        auto start = Clock::now();
        try {
          pg.all_reduce(t)->wait();  // #1
          ADD_FAILURE() << "expected a timeout";
        } catch (const Error& e) {
          caught.record(pg.rank(), e, ms_since(start));
        }
        start = Clock::now();
        try {
          pg.barrier()->wait();  // #2: fails at once
          ADD_FAILURE() << "expected the poisoned group to fail";
        } catch (const Error& e) {
          poisoned.record(pg.rank(), e, ms_since(start));
        }
        auto& gloo = dynamic_cast<ProcessGroupGloo&>(pg);
        EXPECT_THAT(gloo.failure(), HasSubstr("all_reduce #1"));
      },
      with_timeout(500ms));
  // Rank 0 or 1 times out first; the other may see the first one close its connections. Both
  // name rank 2.
  for (int rank : {0, 1}) {
    SCOPED_TRACE(rank);
    EXPECT_THAT(caught.message[rank],
                HasSubstr("all_reduce #1 (sum, f32, 4 elements) on group 'default'"));
    EXPECT_THAT(caught.message[rank], HasSubstr("ranks [2] did not arrive at this all_reduce"));
    EXPECT_GE(caught.elapsed_ms[rank], 400);
    EXPECT_LT(caught.elapsed_ms[rank], 3000);
    EXPECT_THAT(poisoned.message[rank], HasSubstr("barrier #2"));
    EXPECT_THAT(poisoned.message[rank],
                HasSubstr("group 'default' is unusable after an earlier failure"));
    EXPECT_THAT(poisoned.message[rank], HasSubstr("all_reduce #1"));
    EXPECT_LT(poisoned.elapsed_ms[rank], 200);
    // Rank 2's doing, and so is the poisoned group's next failure.
    EXPECT_TRUE(caught.by_peer[rank]);
    EXPECT_TRUE(poisoned.by_peer[rank]);
  }
  const bool someone_timed_out =
      caught.message[0].find("timed out after 500 ms") != std::string::npos ||
      caught.message[1].find("timed out after 500 ms") != std::string::npos;
  EXPECT_TRUE(someone_timed_out) << caught.message[0] << "\n" << caught.message[1];
}

TEST(FaultsTest, PeerWhoseGroupIsGoneFailsTheOpFast) {
  Caught caught;
  run_on_ranks(2, [&](ProcessGroup& pg) {
    pg.barrier()->wait();
    if (pg.rank() == 1) return;  // its group is destroyed
    std::this_thread::sleep_for(100ms);
    Tensor t = ops::ones({4});
    const auto start = Clock::now();
    try {
      pg.all_reduce(t)->wait();
    } catch (const Error& e) {
      caught.record(0, e, ms_since(start));
    }
  });  // 10 s timeout
  EXPECT_THAT(caught.message[0], HasSubstr("all_reduce #1"));
  EXPECT_THAT(caught.message[0], HasSubstr("rank 1"));
  EXPECT_THAT(caught.message[0], HasSubstr("ranks [1] did not arrive at this all_reduce"));
  EXPECT_LT(caught.elapsed_ms[0], 3000);
  EXPECT_TRUE(caught.by_peer[0]);
}

// A transfer posted after the peer's connection broke (this rank was busy computing when it
// went) fails at once naming it: posting holds the mesh's lock while Gloo refuses, and recording
// the failure must not take that lock again (it had hung the rank for good).
TEST(FaultsTest, ATransferPostedToAGonePeerFailsAtOnce) {
  Caught caught;
  run_on_ranks(2, [&](ProcessGroup& pg) {
    pg.barrier()->wait();
    if (pg.rank() == 1) return;  // its group is destroyed: its connections close
    std::this_thread::sleep_for(300ms);
    Tensor t = ops::ones({1 << 16});
    const auto start = Clock::now();
    try {
      pg.send(t, 1)->wait();
      pg.send(t, 1)->wait();
    } catch (const Error& e) {
      caught.record(0, e, ms_since(start));
    }
  });  // 10 s timeout
  EXPECT_THAT(caught.message[0], HasSubstr("rank 1"));
  EXPECT_LT(caught.elapsed_ms[0], 3000);
  EXPECT_TRUE(caught.by_peer[0]);
}

// A send and a recv in flight together (a pipeline stage's) when the peer goes: both fail as the
// peer's doing. The one whose connection broke first closes the mesh while it unwinds, which
// aborts the other before the first has poisoned the group; the abort still counts as the peer's
// (the mesh records a peer's failure as it is thrown), so the rank exits 3, not 1.
TEST(FaultsTest, TransfersInFlightWhenThePeerGoesAreAllItsDoing) {
  for (int trial = 0; trial < 5; ++trial) {
    SCOPED_TRACE(trial);
    std::mutex mutex;
    std::vector<bool> by_peer;
    std::vector<std::string> messages;
    run_on_ranks(2, [&](ProcessGroup& pg) {
      pg.barrier()->wait();
      if (pg.rank() == 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        return;  // its group is destroyed with rank 0's transfers in flight
      }
      Tensor out = ops::ones({1 << 16}), in = ops::zeros({1 << 16});
      auto send = pg.send(out, 1);
      auto recv = pg.recv(in, 1);
      for (const auto& work : {send, recv}) {
        try {
          work->wait();
          ADD_FAILURE() << "a transfer with a rank that left completed";
        } catch (const Error& e) {
          std::lock_guard<std::mutex> lock(mutex);
          by_peer.push_back(is_peer_failure(e));
          messages.push_back(e.what());
        }
      }
    });
    ASSERT_EQ(by_peer.size(), 2u);
    for (size_t i = 0; i < 2; ++i) EXPECT_TRUE(by_peer[i]) << messages[i];
  }
}

// A peer that stalls (a stopped process) with a send and a recv of this rank in flight: the first
// to reach its deadline fails as a timeout and closes the connections, ending the other. That one
// names the timeout that ended it, not only "this rank closed the group's connections", so the
// error a pipeline stage reports (whichever transfer it waited on) says a peer stalled.
TEST(FaultsTest, ATransferEndedByAnotherOnesTimeoutNamesIt) {
  std::mutex mutex;
  std::vector<std::string> messages;
  std::vector<bool> by_peer;
  run_on_ranks(
      2,
      [&](ProcessGroup& pg) {
        pg.barrier()->wait();
        if (pg.rank() == 1) {
          std::this_thread::sleep_for(1500ms);  // stalled past rank 0's deadline, group alive
          return;
        }
        Tensor out = ops::ones({1 << 22}), in = ops::zeros({1 << 16});
        auto send = pg.send(out, 1);
        auto recv = pg.recv(in, 1);
        for (const auto& work : {recv, send}) {
          try {
            work->wait();
          } catch (const Error& e) {
            std::lock_guard<std::mutex> lock(mutex);
            messages.push_back(e.what());
            by_peer.push_back(is_peer_failure(e));
          }
        }
      },
      with_timeout(400ms));
  ASSERT_FALSE(messages.empty());
  for (size_t i = 0; i < messages.size(); ++i) {
    EXPECT_THAT(messages[i], HasSubstr("before the deadline")) << messages[i];
    EXPECT_TRUE(by_peer[i]) << messages[i];
  }
}

TEST(FaultsTest, SubgroupFailureNamesGroupAndGlobalRanks) {
  Caught caught;
  run_on_ranks(4, [&](ProcessGroup& pg) {
    auto odd = pg.new_group({1, 3}, {.name = "odd", .timeout = 300ms});
    if (pg.rank() == 3) {
      std::this_thread::sleep_for(800ms);
      return;
    }
    if (pg.rank() != 1) return;
    Tensor t = ops::ones({4});
    try {
      odd->all_reduce(t)->wait();
    } catch (const Error& e) {
      caught.record(1, e.what(), 0);
    }
  });
  EXPECT_THAT(caught.message[1], HasSubstr("on group 'odd' (rank 0 of 2)"));
  EXPECT_THAT(caught.message[1], HasSubstr("timed out after 300 ms"));
  EXPECT_THAT(caught.message[1], HasSubstr("ranks [1] (global [3]) did not arrive"));
}

// What each of 2 ranks caught from the mismatched collective `call` makes under
// LOOM_DEBUG=collectives (read when groups are created).
std::map<int, std::string> mismatch_under_debug(const std::function<void(ProcessGroup&)>& call) {
  EXPECT_EQ(setenv("LOOM_DEBUG", "collectives", 1), 0);
  Caught caught;
  run_on_ranks(
      2,
      [&](ProcessGroup& pg) {
        try {
          call(pg);
          ADD_FAILURE() << "expected a mismatch";
        } catch (const Error& e) {
          caught.record(pg.rank(), e.what(), 0);
        }
      },
      with_timeout(2s));
  unsetenv("LOOM_DEBUG");
  return caught.message;
}

TEST(FaultsTest, DebugCollectivesMismatchFailsOnBothRanksNamingBothSides) {
  const auto message = mismatch_under_debug([](ProcessGroup& pg) {
    Tensor t = ops::ones({3 + pg.rank()});
    pg.all_reduce(t)->wait();
  });
  for (int rank : {0, 1}) {
    SCOPED_TRACE(rank);
    EXPECT_THAT(message.at(rank), HasSubstr("collective mismatch"));
    EXPECT_THAT(message.at(rank), HasSubstr("all_reduce(sum, f32, 3 elements)"));
    EXPECT_THAT(message.at(rank), HasSubstr("all_reduce(sum, f32, 4 elements)"));
  }
}

// Under LOOM_DEBUG=collectives an uneven all_to_all (a mixture of experts' dispatch) is one call
// when each rank sends each peer what the peer expects: it runs; when not, the pair is named.
TEST(FaultsTest, DebugCollectivesComparesAllToAllSizesPairwise) {
  const auto message = mismatch_under_debug([](ProcessGroup& pg) {
    // Rank r sends peer p (r + 1) * (p + 2) elements; each expects what the other sends.
    const auto sends = [](int r, int p) { return int64_t{(r + 1) * (p + 2)}; };
    std::vector<Tensor> in, out;
    for (int p = 0; p < 2; ++p) {
      in.push_back(ops::full({sends(pg.rank(), p)}, pg.rank()));
      out.push_back(ops::empty({sends(p, pg.rank())}));
    }
    pg.all_to_all(out, in)->wait();
    EXPECT_EQ(
        ops::to_vector(out[1 - pg.rank()]),
        std::vector<double>(static_cast<size_t>(sends(1 - pg.rank(), pg.rank())), 1 - pg.rank()));
    // Rank 1 expects one element too many from rank 0.
    out[0] = ops::empty({sends(0, pg.rank()) + pg.rank()});
    pg.all_to_all(out, in)->wait();
  });
  for (int rank : {0, 1}) {
    SCOPED_TRACE(rank);
    EXPECT_THAT(message.at(rank),
                HasSubstr("rank 0 sends rank 1 3 elements, and rank 1 expects 4 from it"));
  }
}

// Without LOOM_DEBUG=collectives, sizes that differ between ranks are still a named error on
// every rank, never an abort: over TCP a receive only matches a send of its own size (the size is
// in the Gloo slot), so Gloo never meets a message longer than its buffer and both ranks time
// out saying so; over shared memory the first barrier compares sizes and both ranks fail at once
// naming both sides. All-gather of 4 elements on rank 0 and 6 on rank 1 (the shapes of an uneven
// sequence shard handled as even).
std::array<std::string, 2> all_gather_of_mismatched_sizes(bool shared_memory) {
  Caught caught;
  MultiRankOptions options = with_timeout(2s);
  options.gloo.shared_memory = shared_memory;
  run_on_ranks(
      2,
      [&](ProcessGroup& pg) {
        const int64_t mine = 4 + 2 * pg.rank();
        Tensor out = ops::empty({2 * mine});
        try {
          pg.all_gather_into_tensor(out, ops::ones({mine}))->wait();
          ADD_FAILURE() << "expected a named error";
        } catch (const Error& e) {
          caught.record(pg.rank(), e.what(), 0);
        }
      },
      options);
  return {caught.message[0], caught.message[1]};
}

TEST(FaultsTest, SizeMismatchWithoutDebugIsANamedErrorNotAnAbort) {
  const auto messages = all_gather_of_mismatched_sizes(/*shared_memory=*/false);
  for (int rank : {0, 1}) {
    SCOPED_TRACE(rank);
    EXPECT_THAT(messages[rank], HasSubstr("all_gather"));
    EXPECT_THAT(messages[rank],
                HasSubstr("or posted another size, as shapes that differ between ranks do"));
  }
}

TEST(FaultsTest, SizeMismatchOverSharedMemoryNamesBothSidesAtOnce) {
  const auto start = std::chrono::steady_clock::now();
  const auto messages = all_gather_of_mismatched_sizes(/*shared_memory=*/true);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s) << "waited for the 2 s timeout";
  EXPECT_THAT(messages[0], HasSubstr("rank 1 is running all_gather #0 (48 bytes) while this "
                                     "rank runs all_gather #0 (32 bytes)"));
  EXPECT_THAT(messages[1], HasSubstr("rank 0 is running all_gather #0 (32 bytes) while this "
                                     "rank runs all_gather #0 (48 bytes)"));
}

TEST(FaultsTest, AbortInterruptsARunningOpAtOnce) {
  Caught caught;
  run_on_ranks(2, [&](ProcessGroup& pg) {
    if (pg.rank() == 1) {
      std::this_thread::sleep_for(1s);  // never joins the all_reduce
      return;
    }
    auto& gloo = dynamic_cast<ProcessGroupGloo&>(pg);
    Tensor t = ops::ones({1024});
    auto work = pg.all_reduce(t);
    std::thread aborter([&] {
      std::this_thread::sleep_for(100ms);
      gloo.abort("test abort");
    });
    const auto start = Clock::now();
    try {
      work->wait();
    } catch (const Error& e) {
      caught.record(0, e, ms_since(start));
    }
    aborter.join();
    EXPECT_EQ(gloo.failure(), "aborted: test abort");
    try {
      pg.barrier()->wait();
      ADD_FAILURE() << "expected the aborted group to fail";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("unusable after an earlier failure: aborted: test abort"));
      EXPECT_FALSE(is_peer_failure(e)) << "this rank aborted it: not a peer's doing";
    }
  });  // 10 s timeout
  EXPECT_THAT(caught.message[0], HasSubstr("all_reduce #0"));
  EXPECT_THAT(caught.message[0], HasSubstr("test abort"));
  EXPECT_LT(caught.elapsed_ms[0], 1000);
  EXPECT_FALSE(caught.by_peer[0]);
}

// Two ranks made by hand (no harness), so the test controls when each group is destroyed.
void with_two_ranks(Duration timeout,
                    const std::function<void(std::shared_ptr<ProcessGroupGloo>)>& rank0,
                    const std::function<void(std::shared_ptr<ProcessGroupGloo>)>& rank1) {
  auto store = std::make_shared<InMemoryStore>();
  auto make = [&](int rank) {
    return ProcessGroupGloo::create(store, rank, 2, {.name = "pair", .timeout = timeout},
                                    GlooOptions::loopback());
  };
  std::thread other([&] { rank1(make(1)); });
  rank0(make(0));
  other.join();
}

TEST(FaultsTest, DestructionWithQueuedOpsDoesNotHangWhenThePeerIsGone) {
  std::vector<std::shared_ptr<Work>> works;
  int64_t destroy_ms = 0;
  with_two_ranks(
      10s,
      [&](std::shared_ptr<ProcessGroupGloo> pg) {
        pg->barrier()->wait();
        std::this_thread::sleep_for(100ms);  // rank 1's group is gone by now
        std::vector<Tensor> tensors;
        for (int k = 0; k < 5; ++k) {
          tensors.push_back(ops::ones({8}));
          works.push_back(pg->all_reduce(tensors.back()));
        }
        const auto start = Clock::now();
        pg.reset();
        destroy_ms = ms_since(start);
      },
      [](std::shared_ptr<ProcessGroupGloo> pg) { pg->barrier()->wait(); });
  EXPECT_LT(destroy_ms, 3000);
  for (auto& work : works) {
    ASSERT_TRUE(work->is_completed());
    EXPECT_NE(work->exception(), nullptr);
  }
}

TEST(FaultsTest, DestructionWithQueuedOpsIsBoundedByTheTimeoutWhenThePeerIsIdle) {
  int64_t destroy_ms = 0;
  std::string first_error;
  with_two_ranks(
      300ms,
      [&](std::shared_ptr<ProcessGroupGloo> pg) {
        std::vector<std::shared_ptr<Work>> works;
        std::vector<Tensor> tensors;
        for (int k = 0; k < 5; ++k) {
          tensors.push_back(ops::ones({8}));
          works.push_back(pg->all_reduce(tensors.back()));
        }
        const auto start = Clock::now();
        pg.reset();
        destroy_ms = ms_since(start);
        try {
          works[0]->wait();
        } catch (const Error& e) {
          first_error = e.what();
        }
      },
      [](std::shared_ptr<ProcessGroupGloo> pg) { std::this_thread::sleep_for(1500ms); });
  EXPECT_LT(destroy_ms, 1300);  // one timeout, then the poisoned rest fail at once
  EXPECT_THAT(first_error, HasSubstr("timed out after 300 ms"));
  EXPECT_THAT(first_error, HasSubstr("ranks [1] did not arrive at this all_reduce"));
}

TEST(FaultsTest, CreateNamesTheRanksThatNeverJoined) {
  auto store = std::make_shared<InMemoryStore>();
  try {
    ProcessGroupGloo::create(store, 0, 3, {.name = "lonely", .timeout = 200ms},
                             GlooOptions::loopback());
    FAIL() << "expected a rendezvous timeout";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("group 'lonely' (rank 0 of 3): ranks [1, 2] did not join within 200 ms"));
    // The peers' failure, not this rank's own: it exits kExitPeerFailed.
    EXPECT_TRUE(is_peer_failure(e));
  }
}

TEST(FaultsTest, TwoProcessesGivenOneRankAreNamed) {
  // Ranks 0, 1 and 1 again of 3: the second rank 1 fails at once, and rank 0's timeout names the
  // rank that never came and the one that came twice.
  auto store = std::make_shared<InMemoryStore>();
  std::string first, second;
  auto join = [&](int rank, std::string& message) {
    try {
      ProcessGroupGloo::create(store, rank, 3, {.name = "twice", .timeout = 300ms},
                               GlooOptions::loopback());
    } catch (const Error& e) {
      message = e.what();
    }
  };
  std::thread rank0([&] { join(0, first); });
  std::thread rank1([&] { join(1, second); });  // the first rank 1
  std::this_thread::sleep_for(50ms);
  std::string third;
  const auto start = std::chrono::steady_clock::now();
  join(1, third);  // the second: refused at once, well before the timeout
  EXPECT_LT(std::chrono::steady_clock::now() - start, 250ms);
  rank0.join();
  rank1.join();
  EXPECT_THAT(third, HasSubstr("group 'twice' (rank 1 of 3): rank 1 joined 2 times: two processes "
                               "were given rank 1"));
  EXPECT_THAT(first, HasSubstr("ranks [2] did not join within 300 ms; ranks [1] joined twice"));
}

TEST(FaultsTest, EndpointFromTheEnvironment) {
  // LOOM_GLOO_HOSTNAME applies when GlooOptions names neither an interface nor a hostname.
  ASSERT_EQ(setenv("LOOM_GLOO_HOSTNAME", "127.0.0.1", 1), 0);
  auto store = std::make_shared<InMemoryStore>();
  std::thread other([&] {
    auto pg = ProcessGroupGloo::create(store, 1, 2, {.name = "env", .timeout = 5s});
    pg->barrier()->wait();
  });
  auto pg = ProcessGroupGloo::create(store, 0, 2, {.name = "env", .timeout = 5s});
  pg->barrier()->wait();
  other.join();
  unsetenv("LOOM_GLOO_HOSTNAME");

  ASSERT_EQ(setenv("LOOM_GLOO_IFNAME", "no-such-nic1", 1), 0);
  try {
    ProcessGroupGloo::create(std::make_shared<InMemoryStore>(), 0, 1,
                             {.name = "env", .timeout = 200ms});
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("interface 'no-such-nic1' (LOOM_GLOO_IFNAME)"));
  }
  unsetenv("LOOM_GLOO_IFNAME");

  // A name that does not resolve: an error naming it (Gloo itself crashed on it).
  for (const char* host : {"no.such.host.invalid", "256.1.1.1"}) {
    ASSERT_EQ(setenv("LOOM_GLOO_HOSTNAME", host, 1), 0);
    try {
      ProcessGroupGloo::create(std::make_shared<InMemoryStore>(), 0, 1,
                               {.name = "env", .timeout = 200ms});
      ADD_FAILURE() << "expected an error for " << host;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(fmt::format("hostname '{}' (LOOM_GLOO_HOSTNAME)", host)));
      EXPECT_THAT(e.what(), HasSubstr("does not resolve"));
    }
  }
  unsetenv("LOOM_GLOO_HOSTNAME");
}

TEST(FaultsTest, UnknownInterfaceIsAnErrorNamingIt) {
  auto store = std::make_shared<InMemoryStore>();
  GlooOptions gloo;
  gloo.interface = "no-such-nic0";
  try {
    ProcessGroupGloo::create(store, 0, 1, {.name = "x", .timeout = 200ms}, gloo);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("interface 'no-such-nic0' (GlooOptions)"));
  }
}

}  // namespace
}  // namespace loom::comm
