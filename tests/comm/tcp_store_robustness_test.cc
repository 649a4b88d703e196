// The TcpStore server against misbehaving clients: each bad connection (truncated request,
// oversized length, garbage, unknown op, malformed body, wrong version, a client that leaves
// before its reply) is closed alone, with a warning naming the peer and the problem, while an
// established client, a client parked in a wait, and new clients keep being served.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>

#include "base/error.h"
#include "comm/tcp_store.h"
#include "comm/tcp_store_protocol.h"
#include "comm/tcp_store_server.h"
#include "tests/comm/tcp_test_util.h"

namespace loom::comm::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;
namespace ts = tcp_store;

constexpr auto kCloseWithin = std::chrono::milliseconds(3000);

TcpStoreOptions client_options() {
  TcpStoreOptions options;
  options.timeout = std::chrono::seconds(20);
  return options;
}

class TcpStoreRobustnessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TcpStoreServerOptions options;
    options.bind_host = "127.0.0.1";
    options.limits.max_value_bytes = 1 << 20;  // configurable caps, small here
    options.limits.max_key_bytes = 256;
    server_ = std::make_unique<TcpStoreServer>(options);
    good_ = std::make_unique<TcpStore>("127.0.0.1", server_->port(), client_options());
    good_->set("before", "ok");
    // A second client parked in a wait across the whole test.
    waiter_ = std::make_unique<TcpStore>("127.0.0.1", server_->port(), client_options());
    waiter_thread_ =
        std::thread([this] { waited_value_ = waiter_->get_string("released-at-the-end"); });
    std::this_thread::sleep_for(50ms);
  }

  void TearDown() override {
    if (waiter_thread_.joinable()) {
      good_->set("released-at-the-end", "bye");
      waiter_thread_.join();
    }
  }

  // Runs `misbehave` on a raw connection, expects the server to close it and log `problem`
  // naming the peer; then checks the other clients were not disturbed.
  void expect_dropped(const std::function<void(RawClient&)>& misbehave, const std::string& problem,
                      bool server_closes = true) {
    const int before = server_->num_connections();
    ::testing::internal::CaptureStderr();
    std::string peer;
    {
      RawClient bad(server_->port());
      ASSERT_TRUE(bad.connected());
      peer = bad.name();
      misbehave(bad);
      if (server_closes) {
        EXPECT_TRUE(bad.wait_for_close(kCloseWithin)) << "the server kept a bad connection open";
      }
    }
    // The server logs before it closes; give it a moment when the client closed first.
    for (int i = 0; i < 100 && server_->num_connections() > before; ++i)
      std::this_thread::sleep_for(10ms);
    const std::string log = ::testing::internal::GetCapturedStderr();
    EXPECT_THAT(log, HasSubstr(peer));
    EXPECT_THAT(log, HasSubstr(problem));
    EXPECT_EQ(server_->num_connections(), before);
    expect_others_unharmed();
  }

  void expect_others_unharmed() {
    // The established connection still works...
    EXPECT_EQ(good_->get_string("before"), "ok");
    good_->set("after", "fine");
    EXPECT_EQ(good_->add("adds", 1), ++adds_);
    // ...a new client can connect...
    TcpStore fresh("127.0.0.1", server_->port(), client_options());
    EXPECT_EQ(fresh.get_string("after"), "fine");
    // ...and the parked waiter is still connected (checked when it is released in TearDown).
    EXPECT_TRUE(waiter_thread_.joinable());
  }

  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<TcpStore> good_;
  std::unique_ptr<TcpStore> waiter_;
  std::thread waiter_thread_;
  std::string waited_value_;
  int64_t adds_ = 0;
};

TEST_F(TcpStoreRobustnessTest, TruncatedRequestThenClose) {
  expect_dropped(
      [](RawClient& bad) {
        auto frame = raw_header(ts::kMagic, ts::kVersion, static_cast<uint8_t>(ts::Op::kSet), 100);
        frame.resize(frame.size() + 10, 'x');  // 10 of the 100 body bytes
        bad.send(frame);
        std::this_thread::sleep_for(20ms);
        bad.close();
      },
      "in the middle of a request (22 bytes received of 112 bytes)", /*server_closes=*/false);
}

TEST_F(TcpStoreRobustnessTest, LengthHeaderClaimingOneGiB) {
  expect_dropped(
      [](RawClient& bad) {
        bad.send(
            raw_header(ts::kMagic, ts::kVersion, static_cast<uint8_t>(ts::Op::kSet), 1ull << 30));
      },
      "SET request claims a body of 1073741824 bytes, over the limit of");
}

TEST_F(TcpStoreRobustnessTest, GarbageBytes) {
  expect_dropped([](RawClient& bad) { bad.send(std::string("GET / HTTP/1.1\r\nHost: x\r\n\r\n")); },
                 "bad magic byte 0x47 (expected 0xb7)");
}

TEST_F(TcpStoreRobustnessTest, UnknownOpCode) {
  expect_dropped([](RawClient& bad) { bad.send(raw_header(ts::kMagic, ts::kVersion, 99, 0)); },
                 "unknown op code 99");
}

TEST_F(TcpStoreRobustnessTest, BodyWhoseKeyLengthOverrunsIt) {
  expect_dropped(
      [](RawClient& bad) {
        auto frame = raw_header(ts::kMagic, ts::kVersion, static_cast<uint8_t>(ts::Op::kDelete), 8);
        const uint8_t body[8] = {200, 0, 0, 0, 'a', 'b', 'c', 'd'};  // key of 200 bytes in 4
        frame.insert(frame.end(), body, body + 8);
        bad.send(frame);
      },
      "malformed DELETE request: key of 200 bytes at offset 4 overruns the 8-byte body");
}

TEST_F(TcpStoreRobustnessTest, ValueOverTheConfiguredCap) {
  expect_dropped(
      [](RawClient& bad) {
        ts::Request request;
        request.op = ts::Op::kSet;
        request.keys = {"k"};
        request.value = Bytes((1 << 20) + 1, 7);
        ts::Limits loose;
        loose.max_value_bytes = 2 << 20;
        bad.send(ts::encode_request(request, loose));
      },
      "malformed SET request: value of 1048577 bytes exceeds the limit of 1048576 bytes");
}

TEST_F(TcpStoreRobustnessTest, KeyOverTheConfiguredCap) {
  expect_dropped(
      [](RawClient& bad) {
        ts::Request request;
        request.op = ts::Op::kGet;
        request.keys = {std::string(300, 'k')};
        bad.send(ts::encode_request(request, ts::Limits{}));
      },
      "malformed GET request: key of 300 bytes exceeds the limit of 256 bytes");
}

TEST_F(TcpStoreRobustnessTest, WrongProtocolVersionGetsAnErrorReply) {
  std::vector<uint8_t> reply;
  expect_dropped(
      [&](RawClient& bad) {
        bad.send(raw_header(ts::kMagic, 7, static_cast<uint8_t>(ts::Op::kCheck), 4));
        bad.send(std::vector<uint8_t>{0, 0, 0, 0});
        EXPECT_TRUE(bad.wait_for_close(kCloseWithin, &reply));
      },
      "the client speaks TcpStore protocol version 7, this server version 1",
      /*server_closes=*/false);
  ASSERT_GE(reply.size(), ts::kHeaderBytes);
  EXPECT_EQ(reply[2], static_cast<uint8_t>(ts::Status::kError));
  EXPECT_THAT(std::string(reply.begin() + ts::kHeaderBytes + 4, reply.end()),
              HasSubstr("protocol version 7"));
}

TEST_F(TcpStoreRobustnessTest, ClientLeavingBeforeItsLargeReplyDoesNotKillTheServer) {
  good_->set("large", Bytes(1 << 20, 3));
  for (int i = 0; i < 5; ++i) {
    RawClient bad(server_->port());
    ts::Request request;
    request.op = ts::Op::kGet;
    request.keys = {"large"};
    request.timeout_ms = 1000;
    bad.send(ts::encode_request(request, ts::Limits{}));
    bad.close();  // the server's reply meets a closed socket: EPIPE/ECONNRESET, not SIGPIPE
  }
  std::this_thread::sleep_for(100ms);
  expect_others_unharmed();
}

TEST_F(TcpStoreRobustnessTest, ManyBadClientsInARow) {
  for (int i = 0; i < 20; ++i) {
    RawClient bad(server_->port());
    bad.send(std::string(i + 1, static_cast<char>(i)));
    bad.close();
  }
  expect_others_unharmed();
  EXPECT_EQ(waiter_->check({"before"}),
            true);  // the waiter's client serves other threads meanwhile
}

TEST_F(TcpStoreRobustnessTest, TheParkedWaiterIsAnsweredAfterAllThat) {
  expect_dropped([](RawClient& bad) { bad.send(std::string(12, '\xff')); }, "bad magic byte 0xff");
  good_->set("released-at-the-end", "bye");
  waiter_thread_.join();
  EXPECT_EQ(waited_value_, "bye");
}

}  // namespace
}  // namespace loom::comm::testing
