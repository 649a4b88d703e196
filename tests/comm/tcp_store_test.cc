// TcpStore: the conformance suite, plus what only a networked store has: a server on port 0,
// clients in several threads, clients that start before the server, connect and request
// timeouts, server shutdown with clients waiting, and the client-side limits.
#include "comm/tcp_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "base/error.h"
#include "comm/tcp_store_server.h"
#include "tests/comm/store_conformance.h"
#include "tests/comm/tcp_test_util.h"

namespace loom::comm::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr Duration kLong = std::chrono::seconds(20);

int64_t ms_since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

TcpStoreServerOptions loopback_server(int port = 0) {
  TcpStoreServerOptions options;
  options.bind_host = "127.0.0.1";
  options.port = port;
  return options;
}

TcpStoreOptions client_options(Duration timeout = kLong) {
  TcpStoreOptions options;
  options.timeout = timeout;
  return options;
}

// One TcpStore running the server on 127.0.0.1:0; clients are further TcpStores to its port.
class TcpStoreHarness : public StoreHarness {
 public:
  TcpStoreHarness() {
    TcpStoreOptions options = client_options();
    options.is_server = true;
    server_ = std::make_shared<TcpStore>("127.0.0.1", 0, options);
  }
  std::shared_ptr<Store> make_client() override {
    return std::make_shared<TcpStore>("127.0.0.1", server_->port(), client_options());
  }

 private:
  std::shared_ptr<TcpStore> server_;
};

INSTANTIATE_TEST_SUITE_P(TcpStore, StoreConformanceTest,
                         ::testing::Values(StoreHarnessFactory{
                             "TcpStore", [] { return std::make_unique<TcpStoreHarness>(); }}),
                         StoreHarnessName);

TEST(TcpStoreTest, ServerOnPortZeroReportsThePortItPicked) {
  TcpStoreOptions options = client_options();
  options.is_server = true;
  TcpStore server_store("127.0.0.1", 0, options);
  ASSERT_NE(server_store.server(), nullptr);
  EXPECT_GT(server_store.port(), 0);
  EXPECT_EQ(server_store.port(), server_store.server()->port());
  EXPECT_EQ(server_store.address(), "127.0.0.1:" + std::to_string(server_store.port()));
  server_store.set("from-rank-0", "x");  // rank 0 talks to its own server as a client
  TcpStore client("127.0.0.1", server_store.port(), client_options());
  EXPECT_EQ(client.server(), nullptr);
  EXPECT_EQ(client.get_string("from-rank-0"), "x");
}

TEST(TcpStoreTest, ClientsInSeveralThreadsRendezvous) {
  constexpr int kRanks = 8;
  TcpStoreServer server(loopback_server());
  std::vector<std::string> seen(kRanks);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      TcpStore store("127.0.0.1", server.port(), client_options());
      store.set("addr/" + std::to_string(r), "rank" + std::to_string(r));
      std::vector<std::string> keys;
      for (int peer = 0; peer < kRanks; ++peer) keys.push_back("addr/" + std::to_string(peer));
      store.wait(keys);
      if (store.add("arrived", 1) == kRanks) store.set("all-arrived", "yes");
      EXPECT_EQ(store.get_string("all-arrived"), "yes");
      for (int peer = 0; peer < kRanks; ++peer) seen[r] += store.get_string(keys[peer]);
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(seen[r], "rank0rank1rank2rank3rank4rank5rank6rank7");
}

TEST(TcpStoreTest, AClientMayStartBeforeTheServer) {
  const int port = free_loopback_port();
  std::unique_ptr<TcpStoreServer> server;
  std::thread late_server([&] {
    std::this_thread::sleep_for(300ms);
    server = std::make_unique<TcpStoreServer>(loopback_server(port));
  });
  const auto start = Clock::now();
  TcpStore client("127.0.0.1", port,
                  client_options(std::chrono::seconds(10)));  // retries until the server is up
  EXPECT_GE(ms_since(start), 250);
  client.set("k", "v");
  EXPECT_EQ(client.get_string("k"), "v");
  late_server.join();
}

TEST(TcpStoreTest, ConnectTimeoutNamesHostPortAndTimeout) {
  const int port = free_loopback_port();
  const auto start = Clock::now();
  try {
    TcpStore client("127.0.0.1", port, client_options(200ms));
    FAIL() << "connected to a port nobody listens on";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("could not connect to 127.0.0.1:" + std::to_string(port)));
    EXPECT_THAT(e.what(), HasSubstr("within 200 ms"));
    EXPECT_THAT(e.what(), HasSubstr("Connection refused"));
  }
  EXPECT_GE(ms_since(start), 190);
  EXPECT_LT(ms_since(start), 5000);
}

TEST(TcpStoreTest, GetTimeoutNamesKeyHostPortAndTimeout) {
  TcpStoreServer server(loopback_server());
  TcpStore client("127.0.0.1", server.port(), client_options(200ms));
  try {
    client.get("rank3/address");
    FAIL() << "get of a missing key returned";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("'rank3/address'"));
    EXPECT_THAT(e.what(), HasSubstr("127.0.0.1:" + std::to_string(server.port())));
    EXPECT_THAT(e.what(), HasSubstr("200 ms"));
  }
}

TEST(TcpStoreTest, AWaitingClientDoesNotHoldUpOthers) {
  TcpStoreServer server(loopback_server());
  TcpStore waiter("127.0.0.1", server.port(), client_options());
  std::thread blocked([&] { EXPECT_THROW(waiter.wait({"never"}, 800ms), Error); });
  std::this_thread::sleep_for(50ms);  // the wait is parked on the server now
  TcpStore other("127.0.0.1", server.port(), client_options());
  const auto start = Clock::now();
  for (int i = 0; i < 100; ++i) {
    other.set("k" + std::to_string(i), "v");
    EXPECT_EQ(other.get_string("k" + std::to_string(i)), "v");
  }
  EXPECT_LT(ms_since(start), 1000);
  blocked.join();
}

TEST(TcpStoreTest, ServerShutdownWithWaitingClientsDoesNotHang) {
  auto server = std::make_unique<TcpStoreServer>(loopback_server());
  TcpStore client("127.0.0.1", server->port(), client_options(std::chrono::seconds(30)));
  std::string message;
  std::thread waiter([&] {
    try {
      client.get("never");
    } catch (const Error& e) {
      message = e.what();
    }
  });
  std::this_thread::sleep_for(100ms);
  const auto start = Clock::now();
  server.reset();  // joins the server thread
  waiter.join();
  EXPECT_LT(ms_since(start), 3000);
  EXPECT_THAT(message, HasSubstr("the server closed the connection"));
  EXPECT_THAT(message, HasSubstr("get('never')"));
  // Later calls fail (after the connect timeout) instead of crashing on SIGPIPE.
  client.set_timeout(200ms);
  EXPECT_THROW(client.set("k", "v"), Error);
}

TEST(TcpStoreTest, AServerGoneAfterAnsweringIsNamedWithTheShortWindowWaited) {
  auto server = std::make_unique<TcpStoreServer>(loopback_server());
  TcpStore client("127.0.0.1", server->port(), client_options(std::chrono::seconds(30)));
  client.set("k", "v");  // the server has answered
  server.reset();
  // Pooled connections fail as closed; then a new one is refused: after the 2 s reconnect
  // window, not the 30 s timeout, and the message says the window.
  std::string message;
  const auto start = Clock::now();
  for (int i = 0; i < 4 && message.find("could not connect") == std::string::npos; ++i) {
    try {
      client.set("k", "v");
    } catch (const Error& e) {
      message = e.what();
    }
  }
  EXPECT_LT(ms_since(start), 10000);
  EXPECT_THAT(message, HasSubstr("within 2000 ms"));
  EXPECT_THAT(message, HasSubstr("the server answered before: has its process"));
  EXPECT_THAT(message, ::testing::Not(HasSubstr("listening there")));
  // Gone once is gone: later calls (a rank's other process groups reporting through the store)
  // fail at once with the same reason instead of each waiting out the window again.
  const auto again = Clock::now();
  std::string later;
  try {
    client.set("k", "v");
  } catch (const Error& e) {
    later = e.what();
  }
  EXPECT_THAT(later, ::testing::AllOf(HasSubstr("the server answered before: has its process"),
                                      HasSubstr("found earlier; not retried")));
  EXPECT_LT(ms_since(again), 1000);
}

TEST(TcpStoreTest, ClientRejectsOversizedKeysAndValuesBeforeSending) {
  TcpStoreServer server(loopback_server());
  TcpStoreOptions options = client_options();
  options.limits.max_key_bytes = 16;
  options.limits.max_value_bytes = 1024;
  TcpStore client("127.0.0.1", server.port(), options);
  try {
    client.set("k", Bytes(2048));
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("value of 2048 bytes for key 'k' exceeds the limit of 1024 bytes"));
  }
  try {
    client.set(std::string(17, 'x'), "v");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("key of 17 bytes exceeds the limit of 16 bytes"));
  }
  client.set("k", Bytes(1024));
  EXPECT_EQ(client.get("k").size(), 1024u);
}

TEST(TcpStoreTest, ClientErrorsNameTheProblem) {
  EXPECT_THAT(
      [] { TcpStore("127.0.0.1", 0, client_options()); },
      ::testing::ThrowsMessage<Error>(HasSubstr("a client needs the server's port, got 0")));
  EXPECT_THAT([] { TcpStore("", 1234, client_options()); },
              ::testing::ThrowsMessage<Error>(HasSubstr("the host is empty")));
  TcpStoreServer server(loopback_server());
  TcpStoreOptions options;
  options.is_server = true;
  options.timeout = 200ms;
  EXPECT_THAT([&] { TcpStore("127.0.0.1", server.port(), options); },
              ::testing::ThrowsMessage<Error>(
                  HasSubstr("listen on 127.0.0.1:" + std::to_string(server.port()))));
}

}  // namespace
}  // namespace loom::comm::testing
