// The checks themselves: what passes, what fails, and what a failure says (captured with gtest's
// fake reporter, so the expected failures do not fail this test).
#include "tests/testing/tensor_checks.h"

#include <gmock/gmock.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensor/ops.h"

namespace loom::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct Failure {
  std::string message;
  std::string file;
  int line;
};

// The failures `f` reports, in order.
std::vector<Failure> failures_of(const std::function<void()>& f) {
  ::testing::TestPartResultArray results;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    f();
  }
  std::vector<Failure> out;
  for (int i = 0; i < results.size(); ++i) {
    const auto& r = results.GetTestPartResult(i);
    out.push_back({r.message(), r.file_name() ? r.file_name() : "", r.line_number()});
  }
  return out;
}

// The one message of a check that must fail once.
std::string message_of(const std::function<void()>& f) {
  const auto failures = failures_of(f);
  EXPECT_EQ(failures.size(), 1u);
  return failures.empty() ? "<passed>" : failures[0].message;
}

Tensor f32(const std::vector<float>& values, const Shape& shape) {
  return ops::from_vector(values, shape);
}

TEST(ExpectCloseTest, CombinedToleranceIsRelativeToExpected) {
  // |a - e| <= atol + rtol * |e|: with rtol 0.5 an actual of 2 is close to an expected 4 (allowed
  // 2) but an actual of 4 is not close to an expected 2 (allowed 1): the roles are not symmetric.
  const Tolerance half{.rtol = 0.5};
  expect_close({.actual = f32({2}, {1}), .expected = f32({4}, {1}), .tol = half});
  EXPECT_THAT(message_of([&] {
                expect_close({.actual = f32({4}, {1}), .expected = f32({2}, {1}), .tol = half});
              }),
              HasSubstr("actual 4, expected 2, abs error 2, relative error 1, allowed 1"));
  // atol adds to it: |1e-7 - 0| passes with atol 1e-6 and no rtol.
  expect_close({.actual = f32({1e-7f}, {1}), .expected = f32({0}, {1}), .tol = {.atol = 1e-6}});
}

TEST(ExpectCloseTest, ReportsTheWorstElementAndTheTolerance) {
  const Tensor expected = f32({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor actual = f32({1, 2.1f, 3, 4, 5, 9}, {2, 3});
  const std::string message = message_of([&] {
    expect_close({.actual = actual,
                  .expected = expected,
                  .tol = {.rtol = 1e-3, .atol = 1e-6},
                  .what = "forward"});
  });
  EXPECT_THAT(message, HasSubstr("forward: 2 of 6 elements out of tolerance"));
  EXPECT_THAT(message, HasSubstr("worst at [1, 2]: actual 9, expected 6, abs error 3, "
                                 "relative error 0.5, allowed 0.006"));
  EXPECT_THAT(message, HasSubstr("|actual - expected| <= atol + rtol * |expected| with rtol "
                                 "0.001, atol 1e-06"));
}

TEST(ExpectCloseTest, FailsAtTheCallersLine) {
  const int line = __LINE__ + 2;
  const auto failures = failures_of([] {
    expect_close({.actual = f32({1}, {1}), .expected = f32({2}, {1}), .tol = {.atol = 0.5}});
  });
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_THAT(failures[0].file, HasSubstr("tensor_checks_test.cc"));
  EXPECT_EQ(failures[0].line, line);
}

TEST(ExpectCloseTest, RelativeToTheLargestExpectedValue) {
  // 1e-3 off on an element of 0.01 is 10% of it, but 1e-4 of the tensor's largest value 10.
  const Tensor expected = f32({10, 0.01f}, {2});
  const Tensor actual = f32({10, 0.011f}, {2});
  expect_close({.actual = actual,
                .expected = expected,
                .tol = {.rtol = 2e-4, .relative_to = RelativeTo::kLargest}});
  EXPECT_THAT(message_of([&] {
                expect_close({.actual = actual, .expected = expected, .tol = {.rtol = 2e-4}});
              }),
              HasSubstr("worst at [1]"));
  EXPECT_THAT(message_of([&] {
                expect_close({.actual = actual,
                              .expected = expected,
                              .tol = {.rtol = 5e-5, .relative_to = RelativeTo::kLargest}});
              }),
              HasSubstr("rtol * max |expected| (= 10)"));
}

TEST(ExpectCloseTest, NaNAndInfinities) {
  const Tensor nan = f32({NAN}, {1}), inf = f32({INFINITY}, {1}), one = f32({1}, {1});
  // NaN matches NaN only when asked.
  EXPECT_THAT(
      message_of([&] { expect_close({.actual = nan, .expected = nan, .tol = {.atol = 1}}); }),
      HasSubstr("actual nan, expected nan"));
  expect_close({.actual = nan, .expected = nan, .tol = {.equal_nan = true}});
  EXPECT_EQ(failures_of([&] {
              expect_close({.actual = one, .expected = nan, .tol = {.equal_nan = true}});
            }).size(),
            1u);
  // An infinity matches itself, never a finite value, however loose the relative tolerance.
  expect_equal({.actual = inf, .expected = inf});
  EXPECT_EQ(failures_of([&] {
              expect_close({.actual = one, .expected = inf, .tol = {.rtol = 1, .atol = 1}});
            }).size(),
            1u);
  EXPECT_EQ(failures_of([&] {
              expect_close({.actual = inf, .expected = one, .tol = {.rtol = 1, .atol = 1}});
            }).size(),
            1u);
}

TEST(ExpectCloseTest, ShapeDtypeAndCountMismatchesFailWithoutComparing) {
  const Tensor a = f32({1, 2, 3, 4}, {2, 2});
  EXPECT_THAT(message_of([&] { expect_equal({.actual = a, .expected = ops::reshape(a, {4})}); }),
              HasSubstr("shape differs: actual is a tensor (2, 2) f32 on cpu, expected a tensor "
                        "(4,) f32 on cpu"));
  EXPECT_THAT(
      message_of([&] { expect_equal({.actual = ops::to(a, kBFloat16), .expected = a}); }),
      HasSubstr("dtype differs: actual is a tensor (2, 2) bf16 on cpu, expected a tensor (2, 2) "
                "f32 on cpu"));
  EXPECT_THAT(message_of([&] {
                expect_equal({.actual = a, .expected = {1, 2, 3}});
              }),
              HasSubstr("number of elements differs: actual is a tensor (2, 2) f32 on cpu, "
                        "expected a list of 3 values"));
  EXPECT_THAT(message_of([&] { expect_equal({.actual = Tensor(), .expected = a}); }),
              HasSubstr("actual is a undefined tensor"));
}

TEST(ExpectCloseTest, AnExtendedTensorIsNotReadAsItsLocalValues) {
  // What a DTensor is to this layer: a tensor carrying an extension (here a stand-in).
  struct Extension : TensorExtension {
    int kind() const override { return 99; }
  };
  const Tensor plain = f32({1, 2}, {2});
  auto impl = std::make_shared<TensorImpl>(*plain.impl());
  impl->extension = std::make_shared<Extension>();
  const Tensor extended(impl);
  EXPECT_THAT(message_of([&] { expect_equal({.actual = extended, .expected = plain}); }),
              HasSubstr("actual is a distributed tensor (Tensor(shape=(2,), dtype=f32, device=cpu)"
                        "): compare its full_tensor"));
}

TEST(ExpectCloseTest, ListsOfValues) {
  const Tensor a = f32({0.5f, 1.5f, -2}, {3});
  expect_equal({.actual = a, .expected = {0.5, 1.5, -2}});
  expect_close({.actual = std::vector<double>{1.0, 2.0},
                .expected = {1.0, 2.0 + 1e-9},
                .tol = {.atol = 1e-8}});
  EXPECT_THAT(message_of([&] {
                expect_equal({.actual = a, .expected = {0.5, 1.5, 2}});
              }),
              HasSubstr("1 of 3 elements out of tolerance; worst at [2]: actual -2, expected 2"));
}

TEST(ExpectEqualTest, ExactValuesAndExactBytes) {
  const Tensor zero = f32({0.0f}, {1}), minus_zero = f32({-0.0f}, {1});
  expect_equal({.actual = minus_zero, .expected = zero});
  EXPECT_THAT(message_of([&] {
                expect_bitwise_equal({.actual = minus_zero, .expected = zero, .what = "sign"});
              }),
              HasSubstr("sign: 1 of 1 elements differ in their bytes; first at [0]"));
  // Views compare by their elements: a transposed copy's transpose equals the original.
  const Tensor x = ops::to(f32({1, 2, 3, 4, 5, 6}, {2, 3}), kBFloat16);
  const Tensor xt = ops::contiguous(ops::transpose(x, 0, 1));
  expect_bitwise_equal({.actual = ops::transpose(xt, 0, 1), .expected = x});
  EXPECT_THAT(message_of([&] { expect_equal({.actual = f32({1}, {1}), .expected = {1 + 1e-7}}); }),
              HasSubstr("tolerance: exact equality"));
}

TEST(RoundedToTest, RoundsThroughTheDtype) {
  EXPECT_THAT(rounded_to(kBFloat16, {1.0, 1.0 + 1.0 / 1024, 3}), ElementsAre(1.0, 1.0, 3.0));
  EXPECT_THAT(rounded_to(kInt32, {2, -7}), ElementsAre(2.0, -7.0));
  EXPECT_THAT(rounded_to(kFloat32, {0.1}), ElementsAre(static_cast<double>(0.1f)));
}

}  // namespace
}  // namespace loom::testing
