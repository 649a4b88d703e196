// How an attention op's call carries its dropout (AttentionDropout) among its attrs, for the
// op table, autograd's formula and DTensor's strategy to read back: after the op's own attrs, p,
// the seed (as int64), and the region's global shape and offset. A call without dropout carries
// none of them, as calls made before dropout existed.
#pragma once

#include <vector>

#include "tensor/dispatch.h"
#include "tensor/ops_nn.h"

namespace loom::ops {

// Appends `dropout`'s attrs when p > 0.
void append_attention_dropout(std::vector<OpAttr>& attrs, const AttentionDropout& dropout);
// The dropout of `call`, whose own attrs are the first `own` (none after them: no dropout).
AttentionDropout attention_dropout_of(const OpCall& call, size_t own);

}  // namespace loom::ops
