// The attention tests' gradients: q, k, v's through autograd, and their comparison.
#pragma once

#include <string>

#include "autograd/engine.h"
#include "tensor/tensor.h"
#include "tests/testing/tensor_checks.h"

namespace loom::testing {

struct AttentionGradients {
  Tensor dq, dk, dv;
};

// d(sum(out * g))/d(q, k, v) through autograd, for the leaves q, k, v (their grads reset first).
inline AttentionGradients autograd_grads(const Tensor& out, const Tensor& g, const Tensor& q,
                                         const Tensor& k, const Tensor& v) {
  for (const Tensor& t : {q, k, v}) t.set_grad(Tensor());
  backward(out, g);
  return {q.grad(), k.grad(), v.grad()};
}

inline void expect_grads_close(const AttentionGradients& actual, const AttentionGradients& expected,
                               Tolerance tol, const std::string& what) {
  expect_close({.actual = actual.dq, .expected = expected.dq, .tol = tol, .what = what + " dq"});
  expect_close({.actual = actual.dk, .expected = expected.dk, .tol = tol, .what = what + " dk"});
  expect_close({.actual = actual.dv, .expected = expected.dv, .tol = tol, .what = what + " dv"});
}

}  // namespace loom::testing
