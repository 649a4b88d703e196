// Formulas of the elementwise ops. Gradients of broadcast inputs are summed back to the input's
// shape (ops::sum_to).
#include "autograd/formulas.h"

namespace loom::autograd {

namespace {

using C = const OpCall&;
using Outs = std::vector<Tensor>;

// A 0-dim zero of `like`'s dtype: joins DTensor operands as a replicated scalar.
Tensor zero_like_scalar(const Tensor& like) { return ops::zeros({}, like.dtype()); }

}  // namespace

void register_elementwise_formulas(FormulaTable& f) {
  f[OpId::add] = [](C c, Outs out) {
    return record_first("AddBackward", c, std::move(out),
                        [sa = c.inputs[0].shape(), sb = c.inputs[1].shape()](const Grads& g) {
                          return Grads{ops::sum_to(g[0], sa), ops::sum_to(g[0], sb)};
                        });
  };
  f[OpId::sub] = [](C c, Outs out) {
    return record_first("SubBackward", c, std::move(out),
                        [sa = c.inputs[0].shape(), sb = c.inputs[1].shape()](const Grads& g) {
                          return Grads{ops::sum_to(g[0], sa), ops::sum_to(ops::neg(g[0]), sb)};
                        });
  };
  f[OpId::mul] = [](C c, Outs out) {
    return record_first(
        "MulBackward", c, std::move(out), [a = c.inputs[0], b = c.inputs[1]](const Grads& g) {
          return Grads{a.requires_grad() ? ops::sum_to(ops::mul(g[0], b), a.shape()) : Tensor(),
                       b.requires_grad() ? ops::sum_to(ops::mul(g[0], a), b.shape()) : Tensor()};
        });
  };
  f[OpId::div] = [](C c, Outs out) {
    return record_first(
        "DivBackward", c, std::move(out), [a = c.inputs[0], b = c.inputs[1]](const Grads& g) {
          Tensor grad_a = ops::div(g[0], b);
          Tensor grad_b = b.requires_grad() ? ops::neg(ops::div(ops::mul(grad_a, a), b)) : Tensor();
          return Grads{ops::sum_to(grad_a, a.shape()),
                       grad_b.defined() ? ops::sum_to(grad_b, b.shape()) : Tensor()};
        });
  };
  // torch's rule: the larger input takes the gradient; on a tie each takes half.
  f[OpId::maximum] = [](C c, Outs out) {
    return record_first(
        "MaximumBackward", c, std::move(out), [a = c.inputs[0], b = c.inputs[1]](const Grads& g) {
          const Tensor zero = zero_like_scalar(g[0]);
          const Tensor tie = ops::where(ops::eq(a, b), ops::mul(g[0], 0.5), g[0]);
          return Grads{ops::sum_to(ops::where(ops::gt(b, a), zero, tie), a.shape()),
                       ops::sum_to(ops::where(ops::gt(a, b), zero, tie), b.shape())};
        });
  };
  f[OpId::add_scalar] = [](C c, Outs out) {
    return record_first("AddBackward", c, std::move(out),
                        [](const Grads& g) { return Grads{g[0]}; });
  };
  f[OpId::sub_scalar] = [](C c, Outs out) {
    return record_first("SubBackward", c, std::move(out),
                        [](const Grads& g) { return Grads{g[0]}; });
  };
  f[OpId::rsub_scalar] = [](C c, Outs out) {
    return record_first("RsubBackward", c, std::move(out),
                        [](const Grads& g) { return Grads{ops::neg(g[0])}; });
  };
  f[OpId::mul_scalar] = [](C c, Outs out) {
    return record_first("MulBackward", c, std::move(out), [b = c.double_attr(0)](const Grads& g) {
      return Grads{ops::mul(g[0], b)};
    });
  };
  f[OpId::div_scalar] = [](C c, Outs out) {
    return record_first("DivBackward", c, std::move(out), [b = c.double_attr(0)](const Grads& g) {
      return Grads{ops::div(g[0], b)};
    });
  };
  f[OpId::neg] = [](C c, Outs out) {
    return record_first("NegBackward", c, std::move(out),
                        [](const Grads& g) { return Grads{ops::neg(g[0])}; });
  };
  // d|a|/da = sign(a) (0 at 0, as torch).
  f[OpId::abs] = [](C c, Outs out) {
    return record_first("AbsBackward", c, std::move(out), [a = c.inputs[0]](const Grads& g) {
      const Tensor zero = zero_like_scalar(a);
      return Grads{ops::mul(g[0], ops::sub(ops::gt(a, zero), ops::gt(zero, a)))};
    });
  };
  f[OpId::exp] = [](C c, Outs out) {
    return record_first("ExpBackward", c, out,
                        [y = out[0]](const Grads& g) { return Grads{ops::mul(g[0], y)}; });
  };
  f[OpId::log] = [](C c, Outs out) {
    return record_first("LogBackward", c, std::move(out),
                        [a = c.inputs[0]](const Grads& g) { return Grads{ops::div(g[0], a)}; });
  };
  f[OpId::tanh] = [](C c, Outs out) {
    return record_first("TanhBackward", c, out, [y = out[0]](const Grads& g) {
      return Grads{ops::mul(g[0], ops::rsub(ops::mul(y, y), 1.0))};
    });
  };
  f[OpId::sigmoid] = [](C c, Outs out) {
    return record_first("SigmoidBackward", c, out, [y = out[0]](const Grads& g) {
      return Grads{ops::mul(g[0], ops::mul(y, ops::rsub(y, 1.0)))};  // y (1 - y)
    });
  };
  f[OpId::silu] = [](C c, Outs out) {
    return record_first("SiluBackward", c, out, [x = c.inputs[0]](const Grads& g) {
      return Grads{ops::silu_backward(g[0], x)};
    });
  };
  // Inputs (gate, up); both gradients from one pass.
  f[OpId::silu_mul] = [](C c, Outs out) {
    return record_first(
        "SiluMulBackward", c, std::move(out),
        [gate = c.inputs[0], up = c.inputs[1]](const Grads& g) {
          const ops::SiluMulGrads d = ops::silu_mul_backward(g[0], gate, up);
          return Grads{ops::sum_to(d.grad_gate, gate.shape()), ops::sum_to(d.grad_up, up.shape())};
        });
  };
  f[OpId::sqrt] = [](C c, Outs out) {
    return record_first("SqrtBackward", c, out, [y = out[0]](const Grads& g) {
      return Grads{ops::div(ops::mul(g[0], 0.5), y)};
    });
  };
  // d/da a^(-1/2) = -1/2 a^(-3/2) = -1/2 out^3
  f[OpId::rsqrt] = [](C c, Outs out) {
    return record_first("RsqrtBackward", c, out, [y = out[0]](const Grads& g) {
      return Grads{ops::mul(ops::mul(g[0], ops::mul(ops::mul(y, y), y)), -0.5)};
    });
  };
  f[OpId::pow] = [](C c, Outs out) {
    return record_first(
        "PowBackward", c, std::move(out),
        [a = c.inputs[0], exponent = c.double_attr(0)](const Grads& g) {
          if (exponent == 0.0) return Grads{ops::zeros_like(g[0])};
          return Grads{ops::mul(ops::mul(g[0], ops::pow(a, exponent - 1.0)), exponent)};
        });
  };
  f[OpId::relu] = [](C c, Outs out) {
    return record_first("ReluBackward", c, out, [y = out[0]](const Grads& g) {
      return Grads{ops::mul(g[0], ops::gt(y, zero_like_scalar(y)))};
    });
  };
  f[OpId::gelu] = [](C c, Outs out) {
    return record_first("GeluBackward", c, std::move(out), [a = c.inputs[0]](const Grads& g) {
      return Grads{ops::gelu_backward(g[0], a)};
    });
  };
  // Inputs (cond, a, b): cond takes no gradient.
  f[OpId::where] = [](C c, Outs out) {
    return record_first(
        "WhereBackward", c, std::move(out),
        [cond = c.inputs[0], sa = c.inputs[1].shape(), sb = c.inputs[2].shape()](const Grads& g) {
          const Tensor zero = zero_like_scalar(g[0]);
          return Grads{Tensor(), ops::sum_to(ops::where(cond, g[0], zero), sa),
                       ops::sum_to(ops::where(cond, zero, g[0]), sb)};
        });
  };
  // Inputs (self, mask): the mask takes no gradient.
  f[OpId::masked_fill] = [](C c, Outs out) {
    return record_first("MaskedFillBackward", c, std::move(out),
                        [mask = c.inputs[1]](const Grads& g) {
                          return Grads{ops::masked_fill(g[0], mask, 0.0), Tensor()};
                        });
  };
}

}  // namespace loom::autograd
