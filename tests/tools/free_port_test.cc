#include "tools/loomrun/free_port.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/error.h"

namespace loom::loomrun {
namespace {

using ::testing::HasSubstr;

// Whether a listening socket can bind `port` on 127.0.0.1 now.
bool can_bind(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok =
      bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 && listen(fd, 1) == 0;
  close(fd);
  return ok;
}

TEST(FreePortTest, PicksABindablePortOnLoopback) {
  const int port = pick_free_port("127.0.0.1");
  EXPECT_GT(port, 0);
  EXPECT_LE(port, 65535);
  EXPECT_TRUE(can_bind(port)) << "port " << port << " was not released";
}

TEST(FreePortTest, ResolvesAHostName) { EXPECT_GT(pick_free_port("localhost"), 0); }

TEST(FreePortTest, AnAddressOfAnotherMachineIsAnErrorThatSaysWhatToDo) {
  try {
    pick_free_port("192.0.2.1");  // TEST-NET-1: never an address of this machine
    FAIL() << "expected loom::Error";
  } catch (const Error& error) {
    EXPECT_THAT(error.what(), HasSubstr("cannot pick a free port on --master-addr '192.0.2.1'"));
    EXPECT_THAT(error.what(), HasSubstr("Pass --master-port"));
  }
}

}  // namespace
}  // namespace loom::loomrun
