// Differentiable elementwise ops.
#include "autograd/function.h"
#include "autograd/functions.h"

namespace loom {

using autograd::any_requires_grad;
using autograd::record;
using Grads = std::vector<Tensor>;

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = ops::add(a, b);
  if (!any_requires_grad({a, b})) return out;
  return record("AddBackward", {a, b}, out, [sa = a.shape(), sb = b.shape()](const Grads& g) {
    return Grads{ops::sum_to(g[0], sa), ops::sum_to(g[0], sb)};
  });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = ops::sub(a, b);
  if (!any_requires_grad({a, b})) return out;
  return record("SubBackward", {a, b}, out, [sa = a.shape(), sb = b.shape()](const Grads& g) {
    return Grads{ops::sum_to(g[0], sa), ops::sum_to(ops::neg(g[0]), sb)};
  });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = ops::mul(a, b);
  if (!any_requires_grad({a, b})) return out;
  return record("MulBackward", {a, b}, out, [a, b](const Grads& g) {
    return Grads{a.requires_grad() ? ops::sum_to(ops::mul(g[0], b), a.shape()) : Tensor(),
                 b.requires_grad() ? ops::sum_to(ops::mul(g[0], a), b.shape()) : Tensor()};
  });
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = ops::div(a, b);
  if (!any_requires_grad({a, b})) return out;
  return record("DivBackward", {a, b}, out, [a, b](const Grads& g) {
    Tensor grad_a = ops::div(g[0], b);
    Tensor grad_b = b.requires_grad() ? ops::neg(ops::div(ops::mul(grad_a, a), b)) : Tensor();
    return Grads{ops::sum_to(grad_a, a.shape()),
                 grad_b.defined() ? ops::sum_to(grad_b, b.shape()) : Tensor()};
  });
}

Tensor add(const Tensor& a, double b) {
  Tensor out = ops::add(a, b);
  if (!any_requires_grad({a})) return out;
  return record("AddBackward", {a}, out, [](const Grads& g) { return Grads{g[0]}; });
}

Tensor sub(const Tensor& a, double b) {
  Tensor out = ops::sub(a, b);
  if (!any_requires_grad({a})) return out;
  return record("SubBackward", {a}, out, [](const Grads& g) { return Grads{g[0]}; });
}

Tensor rsub(const Tensor& a, double b) {
  Tensor out = ops::rsub(a, b);
  if (!any_requires_grad({a})) return out;
  return record("RsubBackward", {a}, out, [](const Grads& g) { return Grads{ops::neg(g[0])}; });
}

Tensor mul(const Tensor& a, double b) {
  Tensor out = ops::mul(a, b);
  if (!any_requires_grad({a})) return out;
  return record("MulBackward", {a}, out, [b](const Grads& g) { return Grads{ops::mul(g[0], b)}; });
}

Tensor div(const Tensor& a, double b) {
  Tensor out = ops::div(a, b);
  if (!any_requires_grad({a})) return out;
  return record("DivBackward", {a}, out, [b](const Grads& g) { return Grads{ops::div(g[0], b)}; });
}

Tensor neg(const Tensor& a) {
  Tensor out = ops::neg(a);
  if (!any_requires_grad({a})) return out;
  return record("NegBackward", {a}, out, [](const Grads& g) { return Grads{ops::neg(g[0])}; });
}

Tensor exp(const Tensor& a) {
  Tensor out = ops::exp(a);
  if (!any_requires_grad({a})) return out;
  return record("ExpBackward", {a}, out, [out](const Grads& g) { return Grads{ops::mul(g[0], out)}; });
}

Tensor log(const Tensor& a) {
  Tensor out = ops::log(a);
  if (!any_requires_grad({a})) return out;
  return record("LogBackward", {a}, out, [a](const Grads& g) { return Grads{ops::div(g[0], a)}; });
}

Tensor tanh(const Tensor& a) {
  Tensor out = ops::tanh(a);
  if (!any_requires_grad({a})) return out;
  return record("TanhBackward", {a}, out, [out](const Grads& g) {
    return Grads{ops::mul(g[0], ops::rsub(ops::mul(out, out), 1.0))};
  });
}

Tensor sqrt(const Tensor& a) {
  Tensor out = ops::sqrt(a);
  if (!any_requires_grad({a})) return out;
  return record("SqrtBackward", {a}, out, [out](const Grads& g) {
    return Grads{ops::div(ops::mul(g[0], 0.5), out)};
  });
}

Tensor rsqrt(const Tensor& a) {
  Tensor out = ops::rsqrt(a);
  if (!any_requires_grad({a})) return out;
  // d/da a^(-1/2) = -1/2 a^(-3/2) = -1/2 out^3
  return record("RsqrtBackward", {a}, out, [out](const Grads& g) {
    return Grads{ops::mul(ops::mul(g[0], ops::mul(ops::mul(out, out), out)), -0.5)};
  });
}

Tensor pow(const Tensor& a, double exponent) {
  Tensor out = ops::pow(a, exponent);
  if (!any_requires_grad({a})) return out;
  return record("PowBackward", {a}, out, [a, exponent](const Grads& g) {
    if (exponent == 0.0) return Grads{ops::zeros_like(g[0])};
    return Grads{ops::mul(ops::mul(g[0], ops::pow(a, exponent - 1.0)), exponent)};
  });
}

Tensor relu(const Tensor& a) {
  Tensor out = ops::relu(a);
  if (!any_requires_grad({a})) return out;
  return record("ReluBackward", {a}, out, [out](const Grads& g) {
    return Grads{ops::mul(g[0], ops::gt(out, ops::zeros({}, out.dtype())))};
  });
}

Tensor gelu(const Tensor& a) {
  Tensor out = ops::gelu(a);
  if (!any_requires_grad({a})) return out;
  return record("GeluBackward", {a}, out, [a](const Grads& g) {
    return Grads{ops::gelu_backward(g[0], a)};
  });
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Tensor out = ops::where(cond, a, b);
  if (!any_requires_grad({a, b})) return out;
  return record("WhereBackward", {cond, a, b}, out, [cond, sa = a.shape(), sb = b.shape()](const Grads& g) {
    const Tensor zero = ops::zeros({}, g[0].dtype());
    return Grads{Tensor(), ops::sum_to(ops::where(cond, g[0], zero), sa),
                 ops::sum_to(ops::where(cond, zero, g[0]), sb)};
  });
}

Tensor masked_fill(const Tensor& self, const Tensor& mask, double value) {
  Tensor out = ops::masked_fill(self, mask, value);
  if (!any_requires_grad({self})) return out;
  return record("MaskedFillBackward", {self}, out, [mask](const Grads& g) {
    return Grads{ops::masked_fill(g[0], mask, 0.0)};
  });
}

}  // namespace loom
