// Formulas of the views, copies, conversions and concatenation.
#include "autograd/formulas.h"

namespace loom::autograd {

namespace {

using C = const OpCall&;
using Outs = std::vector<Tensor>;

// Backward of an op whose gradient is the output gradient reshaped to the input's shape.
std::vector<Tensor> record_reshape_like(const char* name, C c, Outs out) {
  return record_first(name, c, std::move(out), [shape = c.inputs[0].shape()](const Grads& g) {
    return Grads{ops::reshape(g[0], shape)};
  });
}

// Gradient of a strided sub-view (narrow/slice of `dim` [start:end:step]): zeros of the input's
// shape with the output gradient written into the same sub-view.
std::vector<Tensor> record_subview(const char* name, C c, Outs out, int64_t dim, int64_t start,
                                   int64_t end, int64_t step) {
  return record_first(name, c, std::move(out),
                      [shape = c.inputs[0].shape(), dim, start, end, step](const Grads& g) {
                        return Grads{ops::slice_backward(g[0], shape, dim, start, end, step)};
                      });
}

// The op returned its input itself (a no-op conversion): nothing to record.
bool returned_input(C c, const Outs& out) { return out[0].is_same(c.inputs[0]); }

}  // namespace

void register_view_formulas(FormulaTable& f) {
  f[OpId::view] = [](C c, Outs out) { return record_reshape_like("ViewBackward", c, out); };
  f[OpId::reshape] = [](C c, Outs out) { return record_reshape_like("ReshapeBackward", c, out); };
  f[OpId::unsqueeze] = [](C c, Outs out) {
    return record_reshape_like("UnsqueezeBackward", c, out);
  };
  f[OpId::squeeze] = [](C c, Outs out) { return record_reshape_like("SqueezeBackward", c, out); };
  // Attrs (dim0, dim1).
  f[OpId::transpose] = [](C c, Outs out) {
    return record_first("TransposeBackward", c, std::move(out),
                        [d0 = c.int_attr(0), d1 = c.int_attr(1)](const Grads& g) {
                          return Grads{ops::transpose(g[0], d0, d1)};
                        });
  };
  // Attrs (dims): the gradient takes the inverse permutation.
  f[OpId::permute] = [](C c, Outs out) {
    const std::vector<int64_t>& dims = c.ints_attr(0);
    const int64_t ndim = c.inputs[0].dim();
    std::vector<int64_t> inverse(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) {
      inverse[normalize_dim(dims[i], ndim, "permute")] = static_cast<int64_t>(i);
    }
    return record_first("PermuteBackward", c, std::move(out),
                        [inverse](const Grads& g) { return Grads{ops::permute(g[0], inverse)}; });
  };
  // Attrs (dim, start, length); a negative start counts from the end.
  f[OpId::narrow] = [](C c, Outs out) {
    const Tensor& self = c.inputs[0];
    const int64_t dim = c.int_attr(0), start = c.int_attr(1), length = c.int_attr(2);
    const int64_t first =
        start < 0 ? start + self.size(normalize_dim(dim, self.dim(), "narrow")) : start;
    return record_subview("NarrowBackward", c, std::move(out), dim, first, first + length, 1);
  };
  // Attrs (dim, start, end, step).
  f[OpId::slice] = [](C c, Outs out) {
    return record_subview("SliceBackward", c, std::move(out), c.int_attr(0), c.int_attr(1),
                          c.int_attr(2), c.int_attr(3));
  };
  f[OpId::expand] = [](C c, Outs out) {
    return record_first(
        "ExpandBackward", c, std::move(out),
        [shape = c.inputs[0].shape()](const Grads& g) { return Grads{ops::sum_to(g[0], shape)}; });
  };
  f[OpId::clone] = [](C c, Outs out) {
    return record_first("CloneBackward", c, std::move(out),
                        [](const Grads& g) { return Grads{g[0]}; });
  };
  // Attrs (dtype). Conversions to an integer dtype end the graph, as in torch.
  f[OpId::to_dtype] = [](C c, Outs out) {
    if (returned_input(c, out) || !is_floating(c.dtype_attr(0))) return out;
    return record_first(
        "ToDtypeBackward", c, std::move(out),
        [from = c.inputs[0].dtype()](const Grads& g) { return Grads{ops::to(g[0], from)}; });
  };
  f[OpId::to_device] = [](C c, Outs out) {
    if (returned_input(c, out)) return out;
    return record_first(
        "ToDeviceBackward", c, std::move(out),
        [from = c.inputs[0].device()](const Grads& g) { return Grads{ops::to(g[0], from)}; });
  };
  // Inputs: the tensors; attrs (dim). The gradient splits back into their sizes along dim.
  f[OpId::cat] = [](C c, Outs out) {
    std::vector<int64_t> sizes;
    const int64_t dim = c.int_attr(0);
    for (const Tensor& t : c.inputs) sizes.push_back(t.size(dim));
    return record_first("CatBackward", c, std::move(out), [sizes, dim](const Grads& g) {
      return ops::split_with_sizes(g[0], sizes, dim);
    });
  };
}

}  // namespace loom::autograd
