// The TcpStore server bounds what it holds across all its connections
// (TcpStoreServerOptions::max_memory_bytes): stored values, the buffers of requests being
// received and replies being sent (their capacities: what the process holds), and the value a SET
// decodes beside its buffer. A SET that would go over it is refused with the reason; clients
// streaming large requests at once cannot grow the server past it (the one that would is
// dropped, naming the limit), and the store keeps serving everyone else. Measured as the server
// process's peak resident memory too: connections that set and delete large values do not each
// keep their largest request's buffer.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "comm/tcp_store.h"
#include "comm/tcp_store_protocol.h"
#include "comm/tcp_store_server.h"
#include "tests/comm/tcp_test_util.h"
#include "tests/testing/errors.h"

namespace loom::comm {
namespace {

using loom::testing::error_of;
using ::testing::HasSubstr;
using testing::RawClient;
namespace ts = tcp_store;

constexpr size_t kMiB = 1024 * 1024;

std::unique_ptr<TcpStoreServer> small_server(size_t max_memory_bytes = 3 * kMiB) {
  TcpStoreServerOptions options;
  options.bind_host = "127.0.0.1";
  options.limits.max_value_bytes = 2 * kMiB;
  options.max_memory_bytes = max_memory_bytes;
  return std::make_unique<TcpStoreServer>(options);
}

TEST(TcpStoreMemoryTest, StoredValuesStayUnderTheLimit) {
  auto server = small_server();
  TcpStore store("127.0.0.1", server->port(), {});
  // 1 MiB: a SET of it needs 2 MiB while received (its buffer and the decoded value).
  const std::string big(kMiB, 'x');
  store.set("a", big);
  // The request does not fit beside the stored value: refused, with the reason.
  EXPECT_THAT(error_of([&] { store.set("b", big); }),
              HasSubstr("for its buffer and the value decoded from it"));
  EXPECT_THAT(error_of([&] { store.set("b", big); }),
              HasSubstr("the server refused: a SET request of"));
  EXPECT_THAT(error_of([&] { store.set("b", big); }), HasSubstr("over its limit of 3145728 bytes"));
  store.set("a", std::string(1024, 'y'));  // replacing with less always fits
  store.set("b", big);                     // and frees room
  EXPECT_EQ(store.get_string("a"), std::string(1024, 'y'));
  EXPECT_TRUE(store.delete_key("b"));
  store.set("c", big);
  EXPECT_EQ(store.get_string("c").size(), big.size());
}

TEST(TcpStoreMemoryTest, ClientsStreamingLargeRequestsAtOnceCannotGrowTheServer) {
  auto server = small_server(5 * kMiB);
  ::testing::internal::CaptureStderr();
  // Two clients each start a 2 MiB SET (allowed alone: 4 MiB with its decoded value) and send
  // all but its last byte: together more than the 5 MiB the server may hold, so one of them is
  // dropped.
  std::vector<std::unique_ptr<RawClient>> clients;
  for (int i = 0; i < 2; ++i) {
    ts::Request request;
    request.op = ts::Op::kSet;
    request.keys = {"stream" + std::to_string(i)};
    request.value = Bytes(2 * kMiB - 64, static_cast<uint8_t>('a' + i));
    Bytes frame = ts::encode_request(request, ts::Limits{.max_value_bytes = 2 * kMiB});
    frame.pop_back();
    clients.push_back(std::make_unique<RawClient>(server->port()));
    ASSERT_TRUE(clients.back()->connected());
    clients.back()->send(frame);
  }
  int dropped = 0;
  for (auto& client : clients) dropped += client->wait_for_close(std::chrono::milliseconds(2000));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(dropped, 1) << log;
  EXPECT_THAT(log, HasSubstr("over its limit of 5242880 bytes"));
  // Everyone else is still served.
  TcpStore good("127.0.0.1", server->port(), {});
  good.set("small", "ok");
  EXPECT_EQ(good.get_string("small"), "ok");
}

// A field of /proc/PID/status in KiB ("VmHWM": the peak resident set, "VmRSS": now).
int64_t status_kib(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  }
  return -1;
}

// A server with the default limit (256 MiB) in a process of its own, so its resident memory is
// its own: 10 clients each set and then delete a 60 MiB value on connections they keep open,
// then one stores 60 MiB values until refused. The process's peak resident set stays within the
// limit (beyond what it held before the clients came).
TEST(TcpStoreMemoryTest, TheServersResidentMemoryStaysWithinTheLimit) {
  int port_pipe[2], stop_pipe[2];
  ASSERT_EQ(::pipe(port_pipe), 0);
  ASSERT_EQ(::pipe(stop_pipe), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(port_pipe[0]);
    ::close(stop_pipe[1]);
    TcpStoreServerOptions options;
    options.bind_host = "127.0.0.1";
    TcpStoreServer server(options);
    const int port = server.port();
    if (::write(port_pipe[1], &port, sizeof port) != sizeof port) ::_exit(1);
    char byte;
    while (::read(stop_pipe[0], &byte, 1) > 0) {
    }
    ::_exit(0);
  }
  ::close(port_pipe[1]);
  ::close(stop_pipe[0]);
  int port = 0;
  ASSERT_EQ(::read(port_pipe[0], &port, sizeof port), static_cast<ssize_t>(sizeof port));
  const int64_t before_kib = status_kib(child, "VmRSS");
  const std::string value(60 * kMiB, 'v');
  {
    std::vector<std::unique_ptr<TcpStore>> clients;
    for (int i = 0; i < 10; ++i) {
      clients.push_back(std::make_unique<TcpStore>("127.0.0.1", port, TcpStoreOptions{}));
      clients.back()->set("k" + std::to_string(i), value);
      EXPECT_TRUE(clients.back()->delete_key("k" + std::to_string(i)));
    }
    TcpStore pusher("127.0.0.1", port, TcpStoreOptions{});
    int stored = 0;
    std::string refusal;
    for (; stored < 10 && refusal.empty(); ++stored) {
      try {
        pusher.set("kept" + std::to_string(stored), value);
      } catch (const Error& e) {
        refusal = e.what();
      }
    }
    EXPECT_THAT(refusal, HasSubstr("over its limit of 268435456 bytes"));
    EXPECT_GE(stored, 2);  // at least one 60 MiB value was kept before the refusal
  }
  const int64_t peak_kib = status_kib(child, "VmHWM");
  ::close(stop_pipe[1]);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_GT(before_kib, 0);
  const double grown_mib = static_cast<double>(peak_kib - before_kib) / 1024.0;
  RecordProperty("server_peak_growth_mib", std::to_string(grown_mib));
  EXPECT_LE(grown_mib, 256.0 + 8.0) << "peak " << peak_kib / 1024 << " MiB resident, "
                                    << before_kib / 1024 << " MiB before the clients";
}

}  // namespace
}  // namespace loom::comm
