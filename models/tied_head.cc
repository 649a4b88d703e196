#include "models/tied_head.h"

#include "autograd/functions.h"

namespace loom::models {

Tensor TiedHead::forward(const Tensor& x) {
  return matmul(x, transpose(embedding_->weight(), 0, 1));
}

}  // namespace loom::models
