// The Store conformance suite (see store_conformance.h).
#include "tests/comm/store_conformance.h"

#include <fmt/format.h>
#include <gmock/gmock.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "base/error.h"
#include "comm/prefix_store.h"
#include "tests/testing/errors.h"

namespace loom::comm::testing {
namespace {

using loom::testing::error_of;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Timeout for operations that must succeed; generous so a loaded machine never flakes.
constexpr Duration kLong = std::chrono::seconds(20);
// Timeout for operations that must time out; short so the suite stays fast.
constexpr Duration kShort = std::chrono::milliseconds(200);

int64_t ms_since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

TEST_P(StoreConformanceTest, SetThenGetFromAnotherClient) {
  auto a = client();
  auto b = client();
  a->set("k", "v1");
  EXPECT_EQ(b->get_string("k"), "v1");
  const Bytes binary = {0, 1, 0, 255, 10};
  a->set("binary", binary);
  EXPECT_EQ(b->get("binary"), binary);
  a->set("empty", Bytes{});
  EXPECT_TRUE(b->get("empty").empty());
  EXPECT_TRUE(b->check({"empty"}));
  b->set("k", "v2");  // overwrite
  EXPECT_EQ(a->get_string("k"), "v2");
}

TEST_P(StoreConformanceTest, GetWaitsForALaterSetFromAnotherThread) {
  auto a = client();
  auto b = client();
  a->set_timeout(kLong);
  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    b->set("late", "here");
  });
  const auto start = Clock::now();
  EXPECT_EQ(a->get_string("late"), "here");
  EXPECT_GE(ms_since(start), 90);
  setter.join();
}

TEST_P(StoreConformanceTest, ABlockedGetDoesNotBlockASetThroughTheSameClient) {
  auto a = client();
  a->set_timeout(kLong);
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    a->set("same-client", "x");
  });
  EXPECT_EQ(a->get_string("same-client"), "x");
  setter.join();
}

TEST_P(StoreConformanceTest, GetTimesOutNamingTheKeyAndTheTimeout) {
  auto a = client();
  a->set_timeout(kShort);
  const auto start = Clock::now();
  const std::string message = error_of([&] { a->get("never/set"); });
  const int64_t elapsed = ms_since(start);
  EXPECT_THAT(message, HasSubstr("'never/set'"));
  EXPECT_THAT(message, HasSubstr("200 ms"));
  EXPECT_GE(elapsed, 190);
  EXPECT_LT(elapsed, 5000);
  // The store still works after a timeout.
  a->set("never/set", "now");
  EXPECT_EQ(a->get_string("never/set"), "now");
}

TEST_P(StoreConformanceTest, AddFromManyThreadsIsAtomic) {
  constexpr int kThreads = 4;
  constexpr int kAddsPerThread = 1000;
  auto shared = client();  // threads 0 and 1 share one client, 2 and 3 have their own
  std::vector<std::vector<int64_t>> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto store = t < 2 ? shared : client();
      results[t].reserve(kAddsPerThread);
      for (int i = 0; i < kAddsPerThread; ++i) results[t].push_back(store->add("counter", 1));
    });
  }
  for (auto& thread : threads) thread.join();
  // Every add saw a distinct value: together exactly 1..4000.
  std::vector<int64_t> all;
  for (const auto& r : results) all.insert(all.end(), r.begin(), r.end());
  std::sort(all.begin(), all.end());
  std::vector<int64_t> expected(kThreads * kAddsPerThread);
  std::iota(expected.begin(), expected.end(), 1);
  EXPECT_EQ(all, expected);
  EXPECT_EQ(client()->get_string("counter"), "4000");
}

TEST_P(StoreConformanceTest, AddStartsAtZeroTakesNegativeDeltasAndReadsAsText) {
  auto a = client();
  EXPECT_EQ(a->add("n", 5), 5);
  EXPECT_EQ(a->add("n", -7), -2);
  EXPECT_EQ(a->add("n", 0), -2);
  EXPECT_EQ(client()->get_string("n"), "-2");
  a->set("preset", "40");
  EXPECT_EQ(a->add("preset", 2), 42);
}

TEST_P(StoreConformanceTest, AddOnANonIntegerValueThrowsNamingTheKeyAndValue) {
  auto a = client();
  a->set("text", "hello");
  const std::string message = error_of([&] { a->add("text", 1); });
  EXPECT_THAT(message, HasSubstr("add('text'"));
  EXPECT_THAT(message, HasSubstr("'hello' is not an integer"));
  EXPECT_EQ(a->get_string("text"), "hello");
  EXPECT_EQ(a->add("other", 1), 1);  // the store still works
}

TEST_P(StoreConformanceTest, CheckDoesNotWait) {
  auto a = client();
  const auto start = Clock::now();
  EXPECT_FALSE(a->check({"c1"}));
  EXPECT_LT(ms_since(start), 1000);
  a->set("c1", "x");
  EXPECT_TRUE(a->check({"c1"}));
  EXPECT_FALSE(a->check({"c1", "c2"}));
  client()->add("c2", 1);
  EXPECT_TRUE(a->check({"c1", "c2"}));
  EXPECT_TRUE(a->check({}));
}

TEST_P(StoreConformanceTest, WaitReturnsOnceEveryKeyIsSet) {
  auto a = client();
  auto b = client();
  a->set("w0", "already");
  a->wait({"w0"}, kShort);  // present: returns at once
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    b->set("w1", "1");
    std::this_thread::sleep_for(50ms);
    b->add("w2", 1);
  });
  const auto start = Clock::now();
  a->wait({"w0", "w1", "w2"}, kLong);
  EXPECT_GE(ms_since(start), 90);
  EXPECT_TRUE(a->check({"w1", "w2"}));
  setter.join();
}

TEST_P(StoreConformanceTest, WaitTimesOutNamingTheMissingKeys) {
  auto a = client();
  a->set("present", "x");
  const auto start = Clock::now();
  const std::string message = error_of([&] {
    a->wait({"present", "missing/a", "missing/b"}, kShort);
  });
  EXPECT_GE(ms_since(start), 190);
  EXPECT_THAT(message, HasSubstr("keys ['missing/a', 'missing/b'] were not set"));
  EXPECT_THAT(message, HasSubstr("200 ms"));
  // Without an explicit timeout, wait uses the store's.
  a->set_timeout(kShort);
  EXPECT_THAT(error_of([&] { a->wait({"missing/c"}); }), HasSubstr("keys ['missing/c']"));
}

TEST_P(StoreConformanceTest, DeleteKey) {
  auto a = client();
  auto b = client();
  a->set("d", "x");
  EXPECT_TRUE(b->delete_key("d"));
  EXPECT_FALSE(b->delete_key("d"));
  EXPECT_FALSE(a->check({"d"}));
  a->set_timeout(kShort);
  EXPECT_THAT(error_of([&] { a->get("d"); }), HasSubstr("'d'"));
  b->set("d", "again");
  EXPECT_EQ(a->get_string("d"), "again");
  EXPECT_EQ(a->add("d-counter", 3), 3);
  EXPECT_TRUE(a->delete_key("d-counter"));
  EXPECT_EQ(a->add("d-counter", 3), 3);  // counts from zero again
}

TEST_P(StoreConformanceTest, WaitSeesAKeyThatWasDeletedAndSetAgain) {
  auto a = client();
  auto b = client();
  std::thread writer([&] {
    std::this_thread::sleep_for(50ms);
    b->set("p", "1");
    b->delete_key("p");
    std::this_thread::sleep_for(30ms);
    b->set("q", "1");
    std::this_thread::sleep_for(30ms);
    b->set("p", "2");
  });
  a->wait({"p", "q"}, kLong);
  EXPECT_EQ(a->get_string("p"), "2");
  writer.join();
}

TEST_P(StoreConformanceTest, ManyWaitersWakeOnOneSet) {
  constexpr int kWaiters = 4;
  std::vector<std::string> got(kWaiters);
  std::vector<std::thread> threads;
  for (int t = 0; t < kWaiters; ++t) {
    threads.emplace_back([&, t] {
      auto store = client();
      store->set_timeout(kLong);
      got[t] = store->get_string("broadcast");
    });
  }
  std::this_thread::sleep_for(50ms);
  client()->set("broadcast", "hello");
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < kWaiters; ++t) EXPECT_EQ(got[t], "hello") << "waiter " << t;
}

TEST_P(StoreConformanceTest, PrefixStoresAreIsolated) {
  auto base = client();
  PrefixStore pg0("pg0/", base);
  PrefixStore pg1("pg1/", base);
  pg0.set("k", "zero");
  pg1.set("k", "one");
  EXPECT_EQ(pg0.get_string("k"), "zero");
  EXPECT_EQ(pg1.get_string("k"), "one");
  EXPECT_EQ(base->get_string("pg0/k"), "zero");
  EXPECT_FALSE(base->check({"k"}));
  EXPECT_EQ(pg0.add("n", 3), 3);
  EXPECT_EQ(pg1.add("n", 10), 10);
  EXPECT_EQ(pg0.add("n", 1), 4);
  EXPECT_TRUE(pg1.delete_key("k"));
  EXPECT_TRUE(pg0.check({"k"}));
  EXPECT_FALSE(pg1.check({"k"}));
  const std::string message = error_of([&] { pg1.wait({"k"}, kShort); });
  EXPECT_THAT(message, HasSubstr("'pg1/k'"));
  EXPECT_THAT(message, Not(HasSubstr("pg0/")));
}

Bytes bytes_of(const std::string& text) { return Bytes(text.begin(), text.end()); }

TEST_P(StoreConformanceTest, CompareSetWritesOnlyOverTheExpectedValue) {
  auto a = client();
  auto b = client();
  // Absent: an empty `expected` writes, and everyone reads the value that won.
  EXPECT_EQ(a->compare_set("k", {}, bytes_of("first")), bytes_of("first"));
  EXPECT_EQ(b->compare_set("k", {}, bytes_of("second")), bytes_of("first"));
  EXPECT_EQ(b->get_string("k"), "first");
  // Present: only the value it holds is replaced.
  EXPECT_EQ(b->compare_set("k", bytes_of("wrong"), bytes_of("third")), bytes_of("first"));
  EXPECT_EQ(b->compare_set("k", bytes_of("first"), bytes_of("third")), bytes_of("third"));
  EXPECT_EQ(a->get_string("k"), "third");
  // Absent with a non-empty `expected`: nothing is written and it reads back empty.
  EXPECT_EQ(a->compare_set("absent", bytes_of("x"), bytes_of("y")), Bytes());
  EXPECT_FALSE(b->check({"absent"}));
  // Through a PrefixStore: its own key space.
  PrefixStore pg("pg/", a);
  EXPECT_EQ(pg.compare_set("k", {}, bytes_of("mine")), bytes_of("mine"));
  EXPECT_EQ(b->get_string("pg/k"), "mine");
  EXPECT_EQ(b->get_string("k"), "third");
}

TEST_P(StoreConformanceTest, CompareSetFromManyThreadsIsAtomic) {
  constexpr int kThreads = 4;
  constexpr int kIncrementsPerThread = 100;
  auto shared = client();  // threads 0 and 1 share one client, 2 and 3 have their own
  std::vector<Bytes> first_winner(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto store = t < 2 ? shared : client();
      first_winner[t] = store->compare_set("winner", {}, bytes_of(std::to_string(t)));
      // A counter kept by compare-and-swap retries: a lost update would leave it short. Each
      // value names its writer ("count writer"), so reading back ours means our swap won.
      for (int i = 0; i < kIncrementsPerThread; ++i) {
        Bytes seen = store->compare_set("count", {}, bytes_of("0 -"));
        while (true) {
          const int value = std::stoi(std::string(seen.begin(), seen.end()));
          const Bytes next = bytes_of(fmt::format("{} {}/{}", value + 1, t, i));
          const Bytes now = store->compare_set("count", seen, next);
          if (now == next) break;
          seen = now;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 1; t < kThreads; ++t) EXPECT_EQ(first_winner[t], first_winner[0]) << "thread " << t;
  EXPECT_EQ(client()->get("winner"), first_winner[0]);
  const std::string count = client()->get_string("count");
  EXPECT_EQ(count.substr(0, count.find(' ')), std::to_string(kThreads * kIncrementsPerThread));
}

TEST_P(StoreConformanceTest, CompareSetWakesAWaiter) {
  auto waiter = client();
  std::thread thread([&] { waiter->wait({"cas/key"}, kLong); });
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(client()->compare_set("cas/key", {}, bytes_of("v")), bytes_of("v"));
  thread.join();
  EXPECT_EQ(waiter->get_string("cas/key"), "v");
}

TEST_P(StoreConformanceTest, LargeValuesRoundTrip) {
  std::mt19937 rng(1234);
  Bytes big(1 << 20);
  for (auto& byte : big) byte = static_cast<uint8_t>(rng());
  Bytes big2(big.rbegin(), big.rend());
  auto a = client();
  auto b = client();
  a->set("big", big);
  a->set("big2", big2);
  EXPECT_EQ(b->get("big"), big);
  EXPECT_EQ(b->get("big2"), big2);
  EXPECT_EQ(a->get("big"), big);
}

}  // namespace
}  // namespace loom::comm::testing
