// Parts of a batch draw one forward's dropout masks (nn/batch_part.h): the scopes compose, a
// Dropout inside part i of n draws rows i of the whole batch's mask from the counts restored
// for each part, and under a sequence context its tokens' positions too; parts joined equal the
// whole batch's forward bit for bit.
#include "nn/batch_part.h"

#include <gtest/gtest.h>

#include <vector>

#include "autograd/sequence_context.h"
#include "nn/layers.h"
#include "tensor/ops.h"
#include "tests/testing/errors.h"

namespace loom::nn {
namespace {

using loom::testing::error_of;

Tensor random(const Shape& shape, uint64_t seed) { return ops::normal(shape, seed); }

TEST(BatchPartTest, ScopesNestAndReopenHidesThem) {
  EXPECT_EQ(BatchPart::current().index, 0);
  EXPECT_EQ(BatchPart::current().count, 1);
  {
    const BatchPart dp(1, 2);  // dp rank 1 of 2
    EXPECT_EQ(BatchPart::current().index, 1);
    EXPECT_EQ(BatchPart::current().count, 2);
    {
      const BatchPart micro(2, 3);  // its micro-batch 2 of 3: part 1 * 3 + 2 of 6
      EXPECT_EQ(BatchPart::current().index, 5);
      EXPECT_EQ(BatchPart::current().count, 6);
      const BatchPart::Reopen recompute({0, 4});
      EXPECT_EQ(BatchPart::current().index, 0);
      EXPECT_EQ(BatchPart::current().count, 4);
    }
    EXPECT_EQ(BatchPart::current().index, 1);
  }
  EXPECT_EQ(BatchPart::current().count, 1);
  EXPECT_EQ(error_of([] { BatchPart(2, 2); }),
            "BatchPart: part 2 of 2 equal parts: expected 0 <= index < count");
}

TEST(BatchPartTest, BatchRegionPlacesRowsAndCarriesAPiece) {
  EXPECT_TRUE(batch_region({3, 4}).empty());
  const BatchPart part(1, 2);
  const RngRegion rows = batch_region({3, 4});
  EXPECT_EQ(rows.global_shape, (Shape{6, 4}));
  EXPECT_EQ(rows.global_offset, (Shape{3, 0}));
  // Heads 2..3 of 8 of this part's (3, 8, 5, 5) probabilities.
  const RngRegion heads = batch_region({3, 2, 5, 5}, {{3, 8, 5, 5}, {0, 2, 0, 0}});
  EXPECT_EQ(heads.global_shape, (Shape{6, 8, 5, 5}));
  EXPECT_EQ(heads.global_offset, (Shape{3, 2, 0, 0}));
}

// Three micro-batches of a 6-row batch, each from the same call counts, equal one forward.
TEST(BatchPartTest, DropoutInPartsIsTheWholeBatchsDropout) {
  const Tensor x = random({6, 5, 4}, 1);
  Dropout whole(0.4, 7), parts(0.4, 7);
  const Tensor expected = whole(x);
  const DropoutCalls calls = DropoutCalls::of(parts);
  std::vector<Tensor> outs;
  for (int m = 0; m < 3; ++m) {
    calls.restore();
    const BatchPart part(m, 3);
    outs.push_back(parts(ops::narrow(x, 0, 2 * m, 2)));
  }
  EXPECT_EQ(ops::to_vector(ops::cat(outs, 0)), ops::to_vector(expected));
  EXPECT_EQ(parts.calls(), whole.calls()) << "the parts advance the counts as one forward does";
  // Without the restore each part draws the next call's masks: another result.
  Dropout drifting(0.4, 7);
  std::vector<Tensor> drifted;
  for (int m = 0; m < 3; ++m) {
    const BatchPart part(m, 3);
    drifted.push_back(drifting(ops::narrow(x, 0, 2 * m, 2)));
  }
  EXPECT_NE(ops::to_vector(ops::cat(drifted, 0)), ops::to_vector(expected));
}

// A sequence split as context parallelism's load balancing does (rank 1 of 2 holds chunks 1
// and 2 of 4): its tokens draw their positions' masks.
class TwoChunks : public SequenceContext {
 public:
  std::vector<int64_t> positions(int64_t local_len) const override {
    const int64_t chunk = local_len / 2;
    std::vector<int64_t> out;
    for (int64_t i = 0; i < chunk; ++i) out.push_back(chunk + i);
    for (int64_t i = 0; i < chunk; ++i) out.push_back(2 * chunk + i);
    return out;
  }
  int64_t sequence_length(int64_t local_len) const override { return 2 * local_len; }
  Tensor attention(const Tensor&, const Tensor&, const Tensor&, bool, double, bool,
                   const AttentionDropout&) override {
    return {};
  }
};

TEST(BatchPartTest, DropoutUnderASequenceContextDrawsItsPositions) {
  const Tensor x = random({4, 8, 3}, 2);
  Dropout whole(0.5, 9), local(0.5, 9);
  const Tensor expected = whole(x);
  TwoChunks context;
  const SequenceContextGuard sharded(&context);
  const BatchPart part(1, 2);                                         // rows 2..3 too
  const Tensor mine = ops::narrow(ops::narrow(x, 0, 2, 2), 1, 2, 4);  // positions 2..5
  EXPECT_EQ(ops::to_vector(local(mine)),
            ops::to_vector(ops::narrow(ops::narrow(expected, 0, 2, 2), 1, 2, 4)));
  const RngRegion region = activation_region({2, 4, 3});
  EXPECT_EQ(region.global_shape, (Shape{4, 8, 3}));
  EXPECT_EQ(region.runs_dim, 1);
  EXPECT_EQ(region.runs, (std::vector<int64_t>{0, 2, 4}));  // positions 2..5 are one run
  // A (batch, features) tensor holds no sequence: only its rows are placed.
  const RngRegion pooled = activation_region({2, 6});
  EXPECT_EQ(pooled.global_shape, (Shape{4, 6}));
  EXPECT_TRUE(pooled.runs.empty());
  EXPECT_EQ(error_of([&] {
              batch_region({2, 4, 3}, region);
            }),
            "batch_region: a region in runs (along dim 1) cannot be placed in the batch; pass its "
            "blocks one by one");
}

TEST(BatchPartTest, NextMaskPlacesTheProbabilitiesRows) {
  Dropout attn(0.1, 3);
  EXPECT_EQ(attn.next_mask({2, 4, 5, 5}).p, 0.1);
  EXPECT_TRUE(attn.next_mask({2, 4, 5, 5}).region.empty());
  const BatchPart part(3, 4);
  const AttentionDropout placed = attn.next_mask({2, 4, 5, 5});
  EXPECT_EQ(placed.region.global_shape, (Shape{8, 4, 5, 5}));
  EXPECT_EQ(placed.region.global_offset, (Shape{6, 0, 0, 0}));
  attn.eval();
  EXPECT_EQ(attn.next_mask({2, 4, 5, 5}).p, 0.0);
}

}  // namespace
}  // namespace loom::nn
