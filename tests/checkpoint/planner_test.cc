// The checkpoint planners alone (pure): which rank writes what, and which saved chunks a load
// reads.
#include "checkpoint/planner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>

#include "tests/testing/errors.h"

namespace loom::checkpoint {
namespace {

using loom::testing::error_of;
using ::testing::HasSubstr;

LocalItem item(const std::string& name, Shape shape, Box box, DType dtype = kFloat32) {
  return {name, dtype, std::move(shape), std::move(box)};
}

TEST(SavePlannerTest, ReplicasWriteOncePiecesSpreadOverRanks) {
  // 4 ranks as dp2 x tp2: "w" (8, 4) sharded on dim 0 over tp, replicated over dp; "b" (4)
  // replicated everywhere.
  std::vector<std::vector<LocalItem>> items(4);
  for (int r = 0; r < 4; ++r) {
    const int tp = r % 2;
    items[r].push_back(item("w", {8, 4}, {{tp * 4, 0}, {4, 4}}));
    items[r].push_back(item("b", {4}, {{0}, {4}}));
  }
  const SavePlan plan = plan_save(items, 1 << 20);
  // Two pieces of w and one of b: three writes in all, each once, and not all on rank 0.
  size_t writes = 0;
  for (const auto& w : plan.writes) writes += w.size();
  EXPECT_EQ(writes, 3u);
  EXPECT_EQ(plan.metadata.entries.at("w").chunks.size(), 2u);
  EXPECT_EQ(plan.metadata.entries.at("b").chunks.size(), 1u);
  int writers = 0;
  for (const auto& w : plan.writes) writers += w.empty() ? 0 : 1;
  EXPECT_EQ(writers, 3) << "the fewest-bytes holder writes each piece";
  // Byte ranges follow each other in each rank's file.
  for (size_t r = 0; r < plan.writes.size(); ++r) {
    int64_t offset = 0;
    for (const WriteItem& w : plan.writes[r]) {
      EXPECT_EQ(w.offset, offset);
      offset += w.length;
    }
    if (offset > 0) EXPECT_EQ(plan.metadata.files.at(rank_file_name(r)).bytes, offset);
  }
}

TEST(SavePlannerTest, PiecesSplitIntoBlocksAlongDimZero) {
  // A (10, 3) f32 piece (12 bytes a row) in blocks of at most 40 bytes: 3 rows each.
  const SavePlan plan = plan_save({{item("w", {10, 3}, {{0, 0}, {10, 3}})}}, 40);
  const auto& chunks = plan.metadata.entries.at("w").chunks;
  ASSERT_EQ(chunks.size(), 4u);
  EXPECT_EQ(chunks[0].box, (Box{{0, 0}, {3, 3}}));
  EXPECT_EQ(chunks[3].box, (Box{{9, 0}, {1, 3}}));
  EXPECT_EQ(chunks[3].offset, 9 * 12);
}

TEST(SavePlannerTest, DisagreementsAreNamed) {
  EXPECT_EQ(error_of([] {
              plan_save({{item("w", {8}, {{0}, {8}})}, {item("w", {9}, {{0}, {9}})}}, 64);
            }),
            "checkpoint save: ranks disagree on entry 'w': rank 0 holds f32 (8), rank 1 holds "
            "f32 (9)");
  EXPECT_THAT(error_of([] {
                plan_save({{item("w", {8}, {{0}, {6}})}, {item("w", {8}, {{4}, {4}})}}, 64);
              }),
              HasSubstr("entry 'w': rank 1 holds [4:8], which overlaps [0:6] held by rank 0"));
}

TEST(LoadPlannerTest, RequestsReadTheOverlappingChunks) {
  // Saved as two row halves of (8, 4); loaded as column halves: each request overlaps both.
  std::vector<std::vector<LocalItem>> items = {{item("w", {8, 4}, {{0, 0}, {4, 4}})},
                                               {item("w", {8, 4}, {{4, 0}, {4, 4}})}};
  const Metadata metadata = plan_save(items, 1 << 20).metadata;
  const auto reads = plan_load(metadata, {{"w", kFloat32, {8, 4}, {{0, 2}, {8, 2}}}}, "ckpt");
  ASSERT_EQ(reads.size(), 2u);
  EXPECT_EQ(reads[0].overlap, (Box{{0, 2}, {4, 2}}));
  EXPECT_EQ(reads[1].overlap, (Box{{4, 2}, {4, 2}}));
  // An empty request (an uneven shard's last rank) reads nothing.
  EXPECT_TRUE(plan_load(metadata, {{"w", kFloat32, {8, 4}, {{8, 0}, {0, 4}}}}, "ckpt").empty());
}

TEST(LoadPlannerTest, WhatDoesNotFitIsNamed) {
  const Metadata metadata = plan_save({{item("w", {8, 4}, {{0, 0}, {8, 4}})}}, 1 << 20).metadata;
  EXPECT_EQ(error_of([&] {
              plan_load(metadata, {{"v", kFloat32, {8, 4}, {{0, 0}, {8, 4}}}}, "c");
            }),
            "c: no entry 'v' in the checkpoint (it has 1 entries: w)");
  EXPECT_EQ(error_of([&] {
              plan_load(metadata, {{"w", kFloat32, {8, 5}, {{0, 0}, {8, 5}}}}, "c");
            }),
            "c: entry 'w' was saved with shape (8, 4) but is loaded into shape (8, 5)");
  EXPECT_EQ(error_of([&] {
              plan_load(metadata, {{"w", kBFloat16, {8, 4}, {{0, 0}, {8, 4}}}}, "c");
            }),
            "c: entry 'w' was saved as f32 but is loaded into bf16");
  // Chunks that do not cover the request (a metadata file edited by hand, a lost chunk).
  Metadata partial = metadata;
  partial.entries.at("w").chunks.front().box.sizes[0] = 4;
  EXPECT_EQ(error_of([&] {
              plan_load(partial, {{"w", kFloat32, {8, 4}, {{0, 0}, {8, 4}}}}, "c");
            }),
            "c: entry 'w': the saved chunks cover 16 of the 32 elements of [0:8, 0:4]");
}

TEST(MetadataTest, JsonRoundTripsAndVersionsAreChecked) {
  Metadata m = plan_save({{item("w", {8, 4}, {{0, 0}, {8, 4}}, kBFloat16)}}, 16).metadata;
  m.step = 12;
  m.extra = {{"model", {{"n_layer", 2}}}};
  const Metadata back = metadata_from_json(to_json(m), "m.json");
  EXPECT_EQ(back.step, 12);
  EXPECT_EQ(back.entries.at("w").dtype, kBFloat16);
  EXPECT_EQ(back.entries.at("w").chunks.size(), m.entries.at("w").chunks.size());
  EXPECT_EQ(back.extra, m.extra);
  nlohmann::json future = to_json(m);
  future["version"] = kMetadataVersion + 1;
  EXPECT_THAT(error_of([&] { metadata_from_json(future, "m.json"); }),
              HasSubstr("m.json: metadata version 2, but this build reads version 1 only"));
  EXPECT_THAT(error_of([&] { metadata_from_json(nlohmann::json::object(), "m.json"); }),
              HasSubstr("not a Loom distributed checkpoint's metadata"));
}

// Metadata no save writes (edited, with its marker written to match) is refused by entry and
// chunk before a load copies any byte: a length beyond the box would write past the tensor, and
// overlapping chunks would leave a gap that counting covered elements does not see.
TEST(MetadataTest, ChunksNoSaveWritesAreRefused) {
  const Metadata saved = plan_save({{item("w", {8, 4}, {{0, 0}, {8, 4}})}}, 32).metadata;
  ASSERT_EQ(saved.entries.at("w").chunks.size(), 4u);  // rows 0:2, 2:4, 4:6, 6:8
  const auto refusal = [&](const std::function<void(Metadata&)>& edit) {
    Metadata m = saved;
    edit(m);
    return error_of([&] { metadata_from_json(to_json(m), "m.json"); });
  };
  EXPECT_NO_THROW(metadata_from_json(to_json(saved), "m.json"));
  EXPECT_EQ(refusal([](Metadata& m) { m.entries.at("w").chunks[0].length = 300000; }),
            "m.json: entry 'w', chunk [0:2, 0:4]: 300000 bytes recorded for 8 elements of f32 (32 "
            "bytes)");
  EXPECT_EQ(refusal([](Metadata& m) { m.entries.at("w").chunks[1].box.offsets[0] = 0; }),
            "m.json: entry 'w' has overlapping chunks [0:2, 0:4] and [0:2, 0:4]");
  EXPECT_EQ(refusal([](Metadata& m) { m.entries.at("w").chunks[3].box.offsets[0] = 7; }),
            "m.json: entry 'w' of shape [0:8, 0:4] has a chunk at [7:9, 0:4], outside it");
  EXPECT_EQ(refusal([](Metadata& m) { m.entries.at("w").chunks.pop_back(); }),
            "m.json: entry 'w' of shape [0:8, 0:4]: its chunks hold 24 of its 32 elements");
  // A shape whose element count overflows (it wrapped to a count its chunks matched).
  EXPECT_EQ(refusal([](Metadata& m) {
              m.entries.at("w").shape = {(int64_t{1} << 58) + 64, 64};
            }),
            "m.json: entry 'w' has shape [0:288230376151711808, 0:64]: a size is negative, or "
            "its f32 bytes exceed 2^63");
  EXPECT_EQ(refusal([](Metadata& m) {
              m.entries.at("w").chunks[0].file = "rank_00007.bin";
              m.entries.at("w").chunks[0].writer = 7;
            }),
            "m.json: entry 'w', chunk [0:2, 0:4] is in file 'rank_00007.bin', which the metadata "
            "does not list");
  // Files are the step folder's rank files, named after their writers: nothing else is opened.
  EXPECT_EQ(
      refusal([](Metadata& m) { m.entries.at("w").chunks[0].file = "../step_2/rank_00000.bin"; }),
      "m.json: entry 'w', chunk [0:2, 0:4], names file '../step_2/rank_00000.bin' written by "
      "rank 0, but a save names rank 0's file 'rank_00000.bin', in the step's folder "
      "(metadata a save never writes)");
  EXPECT_EQ(refusal([](Metadata& m) { m.entries.at("w").chunks[0].writer = 99; }),
            "m.json: entry 'w', chunk [0:2, 0:4], names file 'rank_00000.bin' written by rank 99, "
            "but a save names rank 99's file 'rank_00099.bin', in the step's folder (metadata a "
            "save never writes)");
  EXPECT_EQ(refusal([](Metadata& m) { m.files["/etc/passwd"] = m.files.at("rank_00000.bin"); }),
            "m.json: the file list names file '/etc/passwd' written by rank 0, but a save names "
            "rank 0's file 'rank_00000.bin', in the step's folder (metadata a save never writes)");
  nlohmann::json fractional = to_json(saved);
  fractional["entries"]["w"]["shape"] = {8.5, 4};
  EXPECT_EQ(error_of([&] { metadata_from_json(fractional, "m.json"); }),
            "m.json: entry 'w': shape is 8.5, not a whole number");
  EXPECT_EQ(refusal([](Metadata& m) { m.entries.at("w").chunks[3].offset = 120; }),
            "m.json: entry 'w', chunk [6:8, 0:4]: bytes 120 to 152 of 'rank_00000.bin', which "
            "records 128 bytes");
}

}  // namespace
}  // namespace loom::checkpoint
