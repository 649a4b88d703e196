// The TcpStore server bounds what it holds across all its connections
// (TcpStoreServerOptions::max_memory_bytes): stored values plus requests being received. A SET
// that would go over it is refused with the reason; clients streaming large requests at once
// cannot grow the server past it (the one that would is dropped, naming the limit), and the
// store keeps serving everyone else.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
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

std::unique_ptr<TcpStoreServer> small_server() {
  TcpStoreServerOptions options;
  options.bind_host = "127.0.0.1";
  options.limits.max_value_bytes = 2 * kMiB;
  options.max_memory_bytes = 3 * kMiB;
  return std::make_unique<TcpStoreServer>(options);
}

TEST(TcpStoreMemoryTest, StoredValuesStayUnderTheLimit) {
  auto server = small_server();
  TcpStore store("127.0.0.1", server->port(), {});
  const std::string big(1536 * 1024, 'x');  // 1.5 MiB
  store.set("a", big);
  // The request itself does not fit beside the stored value: refused, with the reason.
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
  auto server = small_server();
  ::testing::internal::CaptureStderr();
  // Two clients each start a 2 MiB SET (allowed alone) and send all but its last byte: together
  // more than the 3 MiB the server may hold, so one of them is dropped.
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
  EXPECT_THAT(log, HasSubstr("over its limit of 3145728 bytes"));
  // Everyone else is still served.
  TcpStore good("127.0.0.1", server->port(), {});
  good.set("small", "ok");
  EXPECT_EQ(good.get_string("small"), "ok");
}

}  // namespace
}  // namespace loom::comm
