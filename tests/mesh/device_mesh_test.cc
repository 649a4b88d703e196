// DeviceMesh on real Gloo ranks: coordinates, sizes and rank arrays of 1-D and 2-D meshes, the
// per-dim groups (members, group rank == mesh coordinate, collectives that stay inside a row or
// a column), slicing by names (in the order given), flattening, str(), explicit rank arrays,
// and the error messages of invalid meshes.
#include "mesh/device_mesh.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <vector>

#include "base/error.h"
#include "comm/testing/multi_rank.h"
#include "tensor/ops.h"
#include "tests/mesh/mesh_test_util.h"
#include "tests/testing/errors.h"

namespace loom {
namespace {

using testing::error_of;

using comm::ProcessGroup;
using comm::testing::run_on_ranks;
using loom::testing::make_mesh;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The sum of `value` over the ranks of `group` (an all-reduce).
double group_sum(comm::ProcessGroup& group, double value) {
  Tensor t = ops::full({1}, value);
  group.all_reduce(t)->wait();
  return ops::to_vector(t)[0];
}

TEST(DeviceMeshTest, OneDimMeshCoversTheWorld) {
  run_on_ranks(3, [](ProcessGroup& pg) {
    auto mesh = make_mesh(pg, {"tp"}, {3});
    EXPECT_EQ(mesh->ndim(), 1);
    EXPECT_EQ(mesh->numel(), 3);
    EXPECT_EQ(mesh->size("tp"), 3);
    EXPECT_EQ(mesh->size(0), 3);
    EXPECT_EQ(mesh->dim_index("tp"), 0);
    EXPECT_THAT(mesh->coordinate(), ElementsAre(pg.rank()));
    EXPECT_THAT(mesh->ranks(), ElementsAre(0, 1, 2));
    EXPECT_EQ(mesh->rank(), pg.rank());
    const auto& group = mesh->group("tp");
    ASSERT_NE(group, nullptr);
    EXPECT_EQ(group->size(), 3);
    EXPECT_EQ(group->rank(), pg.rank());
    EXPECT_THAT(group->global_ranks(), ElementsAre(0, 1, 2));
    EXPECT_EQ(group->name(), "mesh/tp");
    EXPECT_EQ(group_sum(*group, pg.rank() + 1), 6);
    EXPECT_EQ(mesh->str(), "DeviceMesh(tp=3, cpu)");
  });
}

TEST(DeviceMeshTest, ItsDeviceTypeIsTheWorldGroupsAndAnotherGivenIsNamed) {
  run_on_ranks(2, [](ProcessGroup& pg) {
    const DeviceMesh same(pg.shared_from_this(), {"dp"}, {2}, DeviceType::kCPU);
    EXPECT_EQ(same.device_type(), DeviceType::kCPU);
    EXPECT_EQ(same.str(), "DeviceMesh(dp=2, cpu)");
    EXPECT_THAT(
        error_of([&] { DeviceMesh(pg.shared_from_this(), {"dp"}, {2}, DeviceType::kCUDA); }),
        HasSubstr("DeviceMesh: device type cuda:0 given, but the world group's tensors "
                  "live on cpu"));
  });
}

// 2x2 on 4 ranks and 2x3 on 6: row-major layout, rank = coord0 * size1 + coord1.
void check_two_dim_mesh(ProcessGroup& pg, int64_t dp, int64_t tp) {
  auto mesh = make_mesh(pg, {"dp", "tp"}, {dp, tp});
  const int rank = pg.rank();
  const int64_t row = rank / tp, col = rank % tp;
  EXPECT_EQ(mesh->ndim(), 2);
  EXPECT_EQ(mesh->numel(), dp * tp);
  EXPECT_EQ(mesh->size("dp"), dp);
  EXPECT_EQ(mesh->size("tp"), tp);
  EXPECT_THAT(mesh->coordinate(), ElementsAre(row, col));
  EXPECT_EQ(mesh->coordinate(0), row);
  EXPECT_EQ(mesh->coordinate(1), col);
  std::vector<int> all(dp * tp);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(mesh->ranks(), all);
  EXPECT_EQ(mesh->str(), fmt::format("DeviceMesh(dp={}, tp={}, cpu)", dp, tp));

  // "tp" groups are rows, "dp" groups are columns; group rank == coordinate along the dim.
  std::vector<int> row_ranks, col_ranks;
  for (int64_t c = 0; c < tp; ++c) row_ranks.push_back(static_cast<int>(row * tp + c));
  for (int64_t r = 0; r < dp; ++r) col_ranks.push_back(static_cast<int>(r * tp + col));
  const auto& tp_group = mesh->group("tp");
  const auto& dp_group = mesh->group("dp");
  ASSERT_NE(tp_group, nullptr);
  ASSERT_NE(dp_group, nullptr);
  EXPECT_EQ(tp_group->size(), tp);
  EXPECT_EQ(dp_group->size(), dp);
  EXPECT_EQ(tp_group->global_ranks(), row_ranks);
  EXPECT_EQ(dp_group->global_ranks(), col_ranks);
  EXPECT_EQ(tp_group->rank(), col);
  EXPECT_EQ(dp_group->rank(), row);
  std::vector<int> identity_tp(tp), identity_dp(dp);
  std::iota(identity_tp.begin(), identity_tp.end(), 0);
  std::iota(identity_dp.begin(), identity_dp.end(), 0);
  EXPECT_EQ(mesh->group_ranks_by_coordinate(1), identity_tp);
  EXPECT_EQ(mesh->group_ranks_by_coordinate(0), identity_dp);
  EXPECT_EQ(mesh->group(1).get(), tp_group.get());

  // An all-reduce on "tp" sums only within the row, on "dp" only within the column.
  double row_sum = 0, col_sum = 0;
  for (int r : row_ranks) row_sum += 100 + r;
  for (int r : col_ranks) col_sum += 100 + r;
  EXPECT_EQ(group_sum(*tp_group, 100 + rank), row_sum);
  EXPECT_EQ(group_sum(*dp_group, 100 + rank), col_sum);

  // Slices reuse the parent's groups.
  const DeviceMesh tp_mesh = (*mesh)["tp"];
  EXPECT_THAT(tp_mesh.dim_names(), ElementsAre("tp"));
  EXPECT_THAT(tp_mesh.shape(), ElementsAre(tp));
  EXPECT_EQ(tp_mesh.ranks(), row_ranks);
  EXPECT_THAT(tp_mesh.coordinate(), ElementsAre(col));
  EXPECT_EQ(tp_mesh.group(0).get(), tp_group.get());
  EXPECT_EQ(tp_mesh.str(), fmt::format("DeviceMesh(tp={}, cpu)", tp));
  const DeviceMesh dp_mesh = (*mesh)["dp"];
  EXPECT_EQ(dp_mesh.ranks(), col_ranks);
  EXPECT_THAT(dp_mesh.coordinate(), ElementsAre(row));
  EXPECT_EQ(dp_mesh.group(0).get(), dp_group.get());
  EXPECT_EQ(group_sum(*dp_mesh.group(0), 1), dp);

  // Slicing keeps the order given: (tp, dp) is the transposed grid.
  const DeviceMesh transposed = (*mesh)[std::vector<std::string>{"tp", "dp"}];
  EXPECT_THAT(transposed.dim_names(), ElementsAre("tp", "dp"));
  EXPECT_THAT(transposed.shape(), ElementsAre(tp, dp));
  EXPECT_THAT(transposed.coordinate(), ElementsAre(col, row));
  std::vector<int> transposed_ranks;
  for (int64_t c = 0; c < tp; ++c)
    for (int64_t r = 0; r < dp; ++r) transposed_ranks.push_back(static_cast<int>(r * tp + c));
  EXPECT_EQ(transposed.ranks(), transposed_ranks);
  EXPECT_EQ(transposed.group("tp").get(), tp_group.get());
  EXPECT_EQ(transposed.group(1).get(), dp_group.get());
  EXPECT_EQ(transposed.str(), fmt::format("DeviceMesh(tp={}, dp={}, cpu)", tp, dp));
  EXPECT_FALSE(transposed == *mesh);
  EXPECT_TRUE(((*mesh)[std::vector<std::string>{"dp", "tp"}] == *mesh));
  // A slice of a slice.
  EXPECT_EQ(transposed["dp"].ranks(), col_ranks);

  // Flattening both dims: one group over every rank.
  const DeviceMesh flat = mesh->flatten({"dp", "tp"}, "dp_tp");
  EXPECT_THAT(flat.dim_names(), ElementsAre("dp_tp"));
  EXPECT_THAT(flat.shape(), ElementsAre(dp * tp));
  EXPECT_THAT(flat.coordinate(), ElementsAre(rank));
  EXPECT_EQ(flat.ranks(), all);
  ASSERT_NE(flat.group(0), nullptr);
  EXPECT_EQ(flat.group(0)->size(), dp * tp);
  EXPECT_EQ(flat.group(0)->global_ranks(), all);
  EXPECT_EQ(flat.group(0)->rank(), rank);
  EXPECT_EQ(flat.group_ranks_by_coordinate(0), all);
  EXPECT_EQ(flat.str(), fmt::format("DeviceMesh(dp_tp={}, cpu)", dp * tp));
  EXPECT_EQ(group_sum(*flat.group("dp_tp"), rank), (dp * tp) * (dp * tp - 1) / 2);
}

TEST(DeviceMeshTest, TwoByTwoMeshRowsColumnsSlicesAndFlatten) {
  run_on_ranks(4, [](ProcessGroup& pg) { check_two_dim_mesh(pg, 2, 2); });
}

TEST(DeviceMeshTest, TwoByThreeMeshRowsColumnsSlicesAndFlatten) {
  run_on_ranks(6, [](ProcessGroup& pg) { check_two_dim_mesh(pg, 2, 3); });
}

TEST(DeviceMeshTest, FlattenKeepsTheOtherDimsAndTheirGroups) {
  // (pp=2, dp=1, tp=2) on 4 ranks: flattening (dp, tp) leaves pp as it was.
  run_on_ranks(4, [](ProcessGroup& pg) {
    auto mesh = make_mesh(pg, {"pp", "dp", "tp"}, {2, 1, 2});
    const int rank = pg.rank();
    EXPECT_THAT(mesh->coordinate(), ElementsAre(rank / 2, 0, rank % 2));
    EXPECT_EQ(mesh->group("dp")->size(), 1);
    const DeviceMesh flat = mesh->flatten({"dp", "tp"}, "dp_tp");
    EXPECT_EQ(flat.str(), "DeviceMesh(pp=2, dp_tp=2, cpu)");
    EXPECT_THAT(flat.coordinate(), ElementsAre(rank / 2, rank % 2));
    EXPECT_EQ(flat.group("pp").get(), mesh->group("pp").get());
    EXPECT_EQ(flat.group("dp_tp")->global_ranks(),
              (std::vector<int>{rank / 2 * 2, rank / 2 * 2 + 1}));
    EXPECT_EQ(group_sum(*flat.group("dp_tp"), rank), rank / 2 * 4 + 1);
    EXPECT_EQ(group_sum(*flat.group("pp"), rank), 2 + 2 * (rank % 2));
    // Flattening needs adjacent dims, in mesh order (checked before any communication).
    EXPECT_THAT(
        error_of([&] {
          mesh->flatten({"pp", "tp"}, "x");
        }),
        HasSubstr(
            "DeviceMesh: flatten of DeviceMesh(pp=2, dp=1, tp=2, cpu) needs adjacent dims in mesh "
            "order, got [pp, tp]"));
    EXPECT_THAT(error_of([&] {
                  mesh->flatten({"tp", "dp"}, "x");
                }),
                HasSubstr("needs adjacent dims in mesh order, got [tp, dp]"));
    EXPECT_THAT(error_of([&] {
                  mesh->flatten({"dp", "tp"}, "pp");
                }),
                HasSubstr("DeviceMesh: flatten name 'pp' already names a dim of DeviceMesh(pp=2, "
                          "dp=1, tp=2, cpu)"));
  });
}

TEST(DeviceMeshTest, FlattenOfASliceMakesOneGroupPerSlice) {
  // mesh[{dp, tp}].flatten(...) on (pp=2, dp=1, tp=2): each pp slice gets its own 2-rank group.
  // The two slices create their groups at the same time with different members.
  run_on_ranks(4, [](ProcessGroup& pg) {
    auto mesh = make_mesh(pg, {"pp", "dp", "tp"}, {2, 1, 2});
    const int rank = pg.rank();
    const DeviceMesh flat =
        (*mesh)[std::vector<std::string>{"dp", "tp"}].flatten({"dp", "tp"}, "dp_tp");
    EXPECT_EQ(flat.str(), "DeviceMesh(dp_tp=2, cpu)");
    EXPECT_EQ(flat.ranks(), (std::vector<int>{rank / 2 * 2, rank / 2 * 2 + 1}));
    EXPECT_THAT(flat.coordinate(), ElementsAre(rank % 2));
    ASSERT_NE(flat.group(0), nullptr);
    EXPECT_EQ(flat.group(0)->global_ranks(), flat.ranks());
    EXPECT_EQ(flat.group(0)->rank(), rank % 2);
    EXPECT_EQ(group_sum(*flat.group(0), rank), rank / 2 * 4 + 1);

    // The transposed 2x2 grid flattened: coordinate tp * 2 + dp, over ranks [0, 2, 1, 3].
    auto grid = make_mesh(pg, {"dp", "tp"}, {2, 2});
    const DeviceMesh column_major =
        (*grid)[std::vector<std::string>{"tp", "dp"}].flatten({"tp", "dp"}, "tp_dp");
    EXPECT_THAT(column_major.ranks(), ElementsAre(0, 2, 1, 3));
    EXPECT_THAT(column_major.coordinate(), ElementsAre(rank % 2 * 2 + rank / 2));
    EXPECT_THAT(column_major.group_ranks_by_coordinate(0), ElementsAre(0, 2, 1, 3));
    EXPECT_EQ(column_major.group(0)->size(), 4);
    EXPECT_EQ(group_sum(*column_major.group(0), rank), 6);
  });
}

TEST(DeviceMeshTest, UnflattenSplitsAdjacentDimsAndKeepsTheOtherGroups) {
  // (pp=2, dp=2, cp=2) on 8 ranks: (dp, cp) read as (ep_shard=1, ep=4), pp's group kept.
  run_on_ranks(8, [](ProcessGroup& pg) {
    auto mesh = make_mesh(pg, {"pp", "dp", "cp"}, {2, 2, 2});
    const int rank = pg.rank();
    const DeviceMesh experts = mesh->unflatten({"dp", "cp"}, {"ep_shard", "ep"}, {1, 4});
    EXPECT_EQ(experts.str(), "DeviceMesh(pp=2, ep_shard=1, ep=4, cpu)");
    EXPECT_EQ(experts.ranks(), mesh->ranks());
    EXPECT_THAT(experts.coordinate(), ElementsAre(rank / 4, 0, rank % 4));
    EXPECT_EQ(experts.group("pp").get(), mesh->group("pp").get());
    EXPECT_EQ(
        experts.group("ep")->global_ranks(),
        (std::vector<int>{rank / 4 * 4, rank / 4 * 4 + 1, rank / 4 * 4 + 2, rank / 4 * 4 + 3}));
    EXPECT_EQ(group_sum(*experts.group("ep"), rank), rank / 4 * 16 + 6);
    EXPECT_EQ(experts.group("ep_shard")->size(), 1);
    // Its slices concatenate with each other (one root), as the expert FSDP mesh does.
    const DeviceMesh pp_ep =
        DeviceMesh::concatenate({experts["pp"], experts[std::vector<std::string>{"ep"}]});
    EXPECT_EQ(pp_ep.str(), "DeviceMesh(pp=2, ep=4, cpu)");
    EXPECT_EQ(pp_ep.ranks(), mesh->ranks());
  });
}

TEST(DeviceMeshTest, UnflattenAcrossDimBoundariesAndItsErrors) {
  // (dp=3, cp=2) on 6 ranks read as (ep_shard=2, ep=3): the split does not follow dp and cp.
  run_on_ranks(6, [](ProcessGroup& pg) {
    auto mesh = make_mesh(pg, {"dp", "cp"}, {3, 2});
    const int rank = pg.rank();
    const DeviceMesh experts = mesh->unflatten({"dp", "cp"}, {"ep_shard", "ep"}, {2, 3});
    EXPECT_THAT(experts.coordinate(), ElementsAre(rank / 3, rank % 3));
    EXPECT_EQ(experts.group("ep")->global_ranks(),
              (std::vector<int>{rank / 3 * 3, rank / 3 * 3 + 1, rank / 3 * 3 + 2}));
    EXPECT_EQ(experts.group("ep_shard")->global_ranks(),
              (std::vector<int>{rank % 3, rank % 3 + 3}));
    EXPECT_EQ(group_sum(*experts.group("ep_shard"), rank), 2 * (rank % 3) + 3);
    // One dim, torch's _unflatten.
    const DeviceMesh split = mesh->unflatten({"cp"}, {"a", "b"}, {1, 2});
    EXPECT_EQ(split.str(), "DeviceMesh(dp=3, a=1, b=2, cpu)");
    EXPECT_EQ(split.group("dp").get(), mesh->group("dp").get());
    EXPECT_EQ(split.group("b")->global_ranks(), mesh->group("cp")->global_ranks());
    // Errors, each before any communication.
    EXPECT_THAT(error_of([&] {
                  mesh->unflatten({"cp", "dp"}, {"a", "b"}, {2, 3});
                }),
                HasSubstr("DeviceMesh: unflatten of DeviceMesh(dp=3, cp=2, cpu) needs adjacent "
                          "dims in mesh order, got [cp, dp]"));
    EXPECT_THAT(error_of([&] {
                  mesh->unflatten({"dp", "cp"}, {"a", "b"}, {4, 2});
                }),
                HasSubstr("DeviceMesh: unflatten of [dp, cp] (of size 6) in DeviceMesh(dp=3, "
                          "cp=2, cpu) into (a=4, b=2) of size 8; the new sizes must multiply to "
                          "the old"));
    EXPECT_THAT(error_of([&] {
                  mesh->unflatten({"dp"}, {"a"}, {3, 1});
                }),
                HasSubstr("got 1 new dim names [a] for 2 sizes [3, 1]"));
    EXPECT_THAT(error_of([&] {
                  (*mesh)["dp"].unflatten({"dp"}, {"a", "b"}, {3, 1});
                }),
                HasSubstr("DeviceMesh: unflatten of DeviceMesh(dp=3, cpu) (of 3 ranks) needs a "
                          "mesh over the whole world of 6 ranks; unflatten the mesh it was "
                          "sliced from"));
    EXPECT_THAT(error_of([&] {
                  mesh->unflatten({"dp"}, {"cp", "x"}, {3, 1});
                }),
                HasSubstr("dim name 'cp' appears twice"));
  });
}

TEST(DeviceMeshTest, ConcatenateJoinsSlicesOfOneRootInTheOrderGiven) {
  // (pp=2, dp=2, tp=2) on 8 ranks: mesh["tp"] + mesh["dp"] is the (tp, dp) grid of this rank's
  // pp slice (what FSDP on top of TP shards a parameter on), reusing both groups.
  run_on_ranks(8, [](ProcessGroup& pg) {
    auto mesh = make_mesh(pg, {"pp", "dp", "tp"}, {2, 2, 2});
    const int rank = pg.rank();
    const int pp = rank / 4, dp = rank / 2 % 2, tp = rank % 2;
    const DeviceMesh joined = DeviceMesh::concatenate({(*mesh)["tp"], (*mesh)["dp"]});
    EXPECT_EQ(joined.str(), "DeviceMesh(tp=2, dp=2, cpu)");
    EXPECT_THAT(joined.coordinate(), ElementsAre(tp, dp));
    // Row-major over (tp, dp): tp outer.
    EXPECT_THAT(joined.ranks(), ElementsAre(pp * 4, pp * 4 + 2, pp * 4 + 1, pp * 4 + 3));
    EXPECT_EQ(joined.group("tp").get(), mesh->group("tp").get());
    EXPECT_EQ(joined.group("dp").get(), mesh->group("dp").get());
    EXPECT_TRUE((joined == (*mesh)[std::vector<std::string>{"tp", "dp"}]));
    // A flattened dim joins too: (pp, dp_tp) from pp and the flattened (dp, tp).
    const DeviceMesh flat =
        (*mesh)[std::vector<std::string>{"dp", "tp"}].flatten({"dp", "tp"}, "dp_tp");
    const DeviceMesh with_pp = DeviceMesh::concatenate({(*mesh)["pp"], flat});
    EXPECT_THAT(with_pp.coordinate(), ElementsAre(pp, dp * 2 + tp));
    EXPECT_EQ(with_pp.ranks(), mesh->ranks());
    EXPECT_THAT(error_of([&] {
                  DeviceMesh::concatenate({(*mesh)["dp"], flat});
                }),
                HasSubstr("dim 'dp_tp' of DeviceMesh(dp_tp=4, cpu) overlaps a dim of an earlier "
                          "mesh"));
    auto other = make_mesh(pg, {"a"}, {8});
    EXPECT_THAT(error_of([&] {
                  DeviceMesh::concatenate({(*mesh)["tp"], *other});
                }),
                HasSubstr("are not slices of one root mesh"));
  });
}

TEST(DeviceMeshTest, ExplicitRankArraysDefineTheLayout) {
  run_on_ranks(4, [](ProcessGroup& pg) {
    const int rank = pg.rank();
    // Reversed: rank 3 is at (0, 0), rank 0 at (1, 1).
    DeviceMesh mesh(pg.shared_from_this(), {"dp", "tp"}, {2, 2}, {3, 2, 1, 0});
    const int position = 3 - rank;
    EXPECT_THAT(mesh.ranks(), ElementsAre(3, 2, 1, 0));
    EXPECT_THAT(mesh.coordinate(), ElementsAre(position / 2, position % 2));
    // Rows of the grid are {3, 2} and {1, 0}; columns {3, 1} and {2, 0}.
    EXPECT_EQ(mesh["tp"].ranks(), rank >= 2 ? (std::vector<int>{3, 2}) : (std::vector<int>{1, 0}));
    EXPECT_EQ(mesh["dp"].ranks(),
              rank % 2 == 1 ? (std::vector<int>{3, 1}) : (std::vector<int>{2, 0}));
    EXPECT_EQ(group_sum(*mesh.group("tp"), rank), rank >= 2 ? 5 : 1);
    EXPECT_EQ(group_sum(*mesh.group("dp"), rank), rank % 2 == 1 ? 4 : 2);
    // new_group numbers group ranks in ascending rank order, so along every line here the
    // coordinates 0, 1 are group ranks 1, 0; DTensor collectives map chunk c through this.
    EXPECT_THAT(mesh.group_ranks_by_coordinate(0), ElementsAre(1, 0));
    EXPECT_THAT(mesh.group_ranks_by_coordinate(1), ElementsAre(1, 0));
    EXPECT_EQ(mesh.group("dp")->rank(), mesh.group_ranks_by_coordinate(0)[mesh.coordinate(0)]);
    EXPECT_EQ(mesh.group("tp")->rank(), mesh.group_ranks_by_coordinate(1)[mesh.coordinate(1)]);
    EXPECT_THAT((mesh[std::vector<std::string>{"tp", "dp"}].group_ranks_by_coordinate(0)),
                ElementsAre(1, 0));
    const DeviceMesh flat = mesh.flatten({"dp", "tp"}, "all");
    EXPECT_THAT(flat.ranks(), ElementsAre(3, 2, 1, 0));
    EXPECT_THAT(flat.coordinate(), ElementsAre(position));
    EXPECT_THAT(flat.group_ranks_by_coordinate(0), ElementsAre(3, 2, 1, 0));
    EXPECT_EQ(flat.group(0)->rank(), rank);
    EXPECT_EQ(mesh.str(), "DeviceMesh(dp=2, tp=2, cpu)");
    EXPECT_FALSE(mesh == *make_mesh(pg, {"dp", "tp"}, {2, 2}));

    // A mesh over a subset of the world: the ranks in it work, the rank left out gets the error
    // (before any communication; the others' groups are among themselves only).
    try {
      DeviceMesh part(pg.shared_from_this(), {"x"}, {3}, {0, 1, 2});
      EXPECT_NE(rank, 3) << "rank 3 is not in the mesh and should get an error";
      EXPECT_THAT(part.coordinate(), ElementsAre(rank));
      EXPECT_EQ(group_sum(*part.group("x"), 1), 3);
    } catch (const Error& e) {
      EXPECT_EQ(rank, 3) << e.what();
      EXPECT_THAT(e.what(),
                  HasSubstr("DeviceMesh: rank 3 is not in the mesh (x=3) over ranks [0, 1, 2]"));
    }
  });
}

TEST(DeviceMeshTest, InvalidMeshesAreRejectedWithTheReason) {
  // Every check fails on every rank before any group is created, so no rank waits on another.
  run_on_ranks(4, [](ProcessGroup& pg) {
    auto world = pg.shared_from_this();
    EXPECT_THAT(
        error_of([&] {
          DeviceMesh(world, {"dp", "tp"}, {2, 3});
        }),
        HasSubstr(
            "DeviceMesh: mesh shape (dp=2, tp=3) has 6 ranks but the world has 4; the product of "
            "the mesh shape must equal the world size"));
    EXPECT_THAT(error_of([&] {
                  DeviceMesh(world, {"dp", "dp"}, {2, 2});
                }),
                HasSubstr("DeviceMesh: dim name 'dp' appears twice in [dp, dp]"));
    EXPECT_THAT(error_of([&] {
                  DeviceMesh(world, {"dp"}, {2, 2});
                }),
                HasSubstr("DeviceMesh: got 1 dim names [dp] for a mesh shape with 2 dims; pass one "
                          "name per dim"));
    EXPECT_THAT(error_of([&] {
                  DeviceMesh(world, {"dp", ""}, {2, 2});
                }),
                HasSubstr("DeviceMesh: empty dim name in [dp, ]"));
    EXPECT_THAT(error_of([&] {
                  DeviceMesh(world, {"dp", "tp"}, {2, 2}, {0, 1, 2});
                }),
                HasSubstr("DeviceMesh: mesh shape (dp=2, tp=2) needs 4 ranks but 3 were given"));
    EXPECT_THAT(error_of([&] {
                  DeviceMesh(world, {"dp", "tp"}, {2, 2}, {0, 1, 1, 2});
                }),
                HasSubstr("DeviceMesh: ranks [0, 1, 1, 2] contain duplicates"));
    EXPECT_THAT(error_of([&] {
                  DeviceMesh(world, {"dp", "tp"}, {2, 2}, {0, 1, 2, 7});
                }),
                HasSubstr("DeviceMesh: rank 7 is not in the world of size 4"));
    EXPECT_THAT(error_of([&] {
                  DeviceMesh(world, {"dp", "tp"}, {0, 2}, std::vector<int>{});
                }),
                HasSubstr("DeviceMesh: mesh shape (dp=0, tp=2) has a dim of size 0"));

    // Unknown names and dims on a valid mesh.
    auto mesh = make_mesh(pg, {"dp", "tp"}, {2, 2});
    const std::string unknown =
        "DeviceMesh: no dim named 'pp' in DeviceMesh(dp=2, tp=2, cpu); its dims are [dp, tp]";
    EXPECT_THAT(error_of([&] { mesh->size("pp"); }), HasSubstr(unknown));
    EXPECT_THAT(error_of([&] { mesh->group("pp"); }), HasSubstr(unknown));
    EXPECT_THAT(error_of([&] { (*mesh)["pp"]; }), HasSubstr(unknown));
    EXPECT_THAT(error_of([&] { mesh->flatten({"dp", "pp"}, "x"); }), HasSubstr(unknown));
    EXPECT_THAT(
        error_of([&] { mesh->group(2); }),
        HasSubstr(
            "DeviceMesh: mesh_dim 2 out of range for DeviceMesh(dp=2, tp=2, cpu) with 2 dims"));
    EXPECT_THAT(
        error_of([&] {
          (*mesh)[std::vector<std::string>{"tp", "tp"}];
        }),
        HasSubstr("DeviceMesh: dim 'tp' named twice in slice of DeviceMesh(dp=2, tp=2, cpu)"));
  });
}

TEST(DeviceMeshTest, OneRankWorld) {
  run_on_ranks(1, [](ProcessGroup& pg) {
    auto mesh = make_mesh(pg, {"dp", "tp"}, {1, 1});
    EXPECT_THAT(mesh->coordinate(), ElementsAre(0, 0));
    EXPECT_EQ(mesh->group("tp")->size(), 1);
    EXPECT_EQ(group_sum(*mesh->group("dp"), 7), 7);
    EXPECT_EQ(mesh->flatten({"dp", "tp"}, "all").str(), "DeviceMesh(all=1, cpu)");
    EXPECT_THAT(error_of([&] { DeviceMesh(pg.shared_from_this(), {"x"}, {1}, {1}); }),
                HasSubstr("DeviceMesh: rank 1 is not in the world of size 1"));
    EXPECT_THAT(error_of([&] { DeviceMesh(pg.shared_from_this(), {"x"}, {2}); }),
                HasSubstr("DeviceMesh: mesh shape (x=2) has 2 ranks but the world has 1"));
  });
}

}  // namespace
}  // namespace loom
