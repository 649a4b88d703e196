// A conformance suite every Store implementation passes: instantiate it with a factory for the
// store under test.
//
//   INSTANTIATE_TEST_SUITE_P(FileStore, StoreConformanceTest,
//                            testing::Values(StoreHarnessFactory{"FileStore", [] { return ...; }}),
//                            StoreHarnessName);
//
// A harness stands for one backing store (a file, a server); make_client() returns a new handle
// onto it (another FileStore on the same file, another TcpStore client), as separate processes
// or ranks would hold. Tests use several clients from several threads.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "comm/store.h"

namespace loom::comm::testing {

class StoreHarness {
 public:
  virtual ~StoreHarness() = default;
  virtual std::shared_ptr<Store> make_client() = 0;
};

struct StoreHarnessFactory {
  std::string name;
  std::function<std::unique_ptr<StoreHarness>()> make;
  friend std::ostream& operator<<(std::ostream& os, const StoreHarnessFactory& f) {
    return os << f.name;
  }
};

inline std::string StoreHarnessName(const ::testing::TestParamInfo<StoreHarnessFactory>& info) {
  return info.param.name;
}

class StoreConformanceTest : public ::testing::TestWithParam<StoreHarnessFactory> {
 protected:
  void SetUp() override { harness_ = GetParam().make(); }
  void TearDown() override { harness_.reset(); }
  std::shared_ptr<Store> client() { return harness_->make_client(); }

  std::unique_ptr<StoreHarness> harness_;
};

}  // namespace loom::comm::testing
