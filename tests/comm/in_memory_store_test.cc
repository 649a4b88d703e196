#include "comm/in_memory_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "base/error.h"
#include "tests/comm/store_conformance.h"

namespace loom::comm {
namespace {

// Threads of one process share the one store, so every client is the same object.
class InMemoryStoreHarness : public testing::StoreHarness {
 public:
  std::shared_ptr<Store> make_client() override { return store_; }

 private:
  std::shared_ptr<InMemoryStore> store_ = std::make_shared<InMemoryStore>(std::chrono::seconds(20));
};

using testing::StoreConformanceTest;
INSTANTIATE_TEST_SUITE_P(InMemoryStore, StoreConformanceTest,
                         ::testing::Values(testing::StoreHarnessFactory{
                             "InMemoryStore",
                             [] { return std::make_unique<InMemoryStoreHarness>(); }}),
                         testing::StoreHarnessName);

using ::testing::HasSubstr;
using namespace std::chrono_literals;

TEST(InMemoryStoreTest, SetGetCheckDelete) {
  InMemoryStore store;
  EXPECT_FALSE(store.check({"a"}));
  store.set("a", std::string("1"));
  EXPECT_TRUE(store.check({"a"}));
  EXPECT_EQ(store.get_string("a"), "1");
  store.set("a", Bytes{0, 255});
  EXPECT_EQ(store.get("a"), (Bytes{0, 255}));
  EXPECT_TRUE(store.delete_key("a"));
  EXPECT_FALSE(store.delete_key("a"));
  EXPECT_EQ(store.size(), 0u);
}

TEST(InMemoryStoreTest, AddCountsFromZero) {
  InMemoryStore store;
  EXPECT_EQ(store.add("n", 2), 2);
  EXPECT_EQ(store.add("n", -5), -3);
  EXPECT_EQ(store.get_string("n"), "-3");
  store.set("text", std::string("abc"));
  try {
    store.add("text", 1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("add('text'): the stored value 'abc' is not an integer"));
  }
}

TEST(InMemoryStoreTest, WaitWakesWhenAnotherThreadSets) {
  InMemoryStore store;
  std::thread setter([&] {
    std::this_thread::sleep_for(20ms);
    store.set("x", std::string("1"));
    store.set("y", std::string("2"));
  });
  store.wait({"x", "y"}, 5000ms);
  EXPECT_EQ(store.get_string("y"), "2");
  setter.join();
}

TEST(InMemoryStoreTest, WaitTimesOutNamingMissingKeysAndTimeout) {
  InMemoryStore store;
  store.set("present", std::string("1"));
  const auto start = std::chrono::steady_clock::now();
  try {
    store.wait({"present", "absent"}, 50ms);
    FAIL() << "expected a timeout";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("keys ['absent'] were not set within the timeout of 50 ms"));
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, 50ms);
}

TEST(InMemoryStoreTest, GetTimesOutWithTheStoreTimeout) {
  InMemoryStore store(30ms);
  try {
    store.get("never");
    FAIL() << "expected a timeout";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("key 'never' did not appear within 30 ms"));
  }
}

}  // namespace
}  // namespace loom::comm
