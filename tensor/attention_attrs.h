// How an attention op's call carries its dropout (AttentionDropout) among its attrs, for the
// op table, autograd's formula and DTensor's strategy to read back: after the op's own attrs, p,
// the seed (as int64), and the region's global shape and offset. A call without dropout carries
// none of them, as calls made before dropout existed. A dropout call's region rides alike.
#pragma once

#include <vector>

#include "tensor/dispatch.h"
#include "tensor/ops_nn.h"

namespace loom::ops {

// Where a call's dropout attrs start: after the forward's own (is_causal, scale, causal_offset,
// enable_gqa) and the backward's (is_causal, scale, causal_offset, delta_from_out, enable_gqa).
// The seed is the attr after p: new on every call, so DTensor's strategy cache leaves it out of
// its key (dtensor/sharding/propagator.cc).
inline constexpr size_t kAttentionDropoutAttrs = 4;
inline constexpr size_t kAttentionBackwardDropoutAttrs = 5;

// Appends `dropout`'s attrs when p > 0.
void append_attention_dropout(std::vector<OpAttr>& attrs, const AttentionDropout& dropout);
// The dropout of `call`, whose own attrs are the first `own` (none after them: no dropout).
AttentionDropout attention_dropout_of(const OpCall& call, size_t own);

// The region of a dropout call (attrs p, seed, training, then the region's global shape and
// offset when one was given, and its runs as (runs_dim, triples...) when it has them:
// ops::dropout); empty without one.
RngRegion dropout_region_of(const OpCall& call);

}  // namespace loom::ops
