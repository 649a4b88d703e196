// The one error_of every test uses: the message of the loom::Error a call throws.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "base/error.h"

namespace loom::testing {

// The message of the loom::Error `f` throws. If it throws nothing the test fails and the result
// is "<no error>", which no expected message matches.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a loom::Error, nothing was thrown";
  return "<no error>";
}

}  // namespace loom::testing
