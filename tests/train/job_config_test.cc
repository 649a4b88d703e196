// The job's settings (train/job_config.h): a TOML file and the command line set the same fields
// through one table, every bad value is named where it came from, and the effective config
// written out reads back to the same job.
#include "train/job_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <set>
#include <string>

#include "base/error.h"
#include "tests/testing/errors.h"

namespace loom::train {
namespace {

using loom::testing::error_of;
using ::testing::HasSubstr;

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  std::ofstream(path) << text;
  return path;
}

const JobOption& option(std::string_view key) {
  for (const JobOption& o : job_options()) {
    if (o.key == key) return o;
  }
  throw std::runtime_error("no option " + std::string(key));
}

TEST(JobConfigTest, EveryOptionHasAUniqueKeyAndFlag) {
  std::set<std::string> flags;
  for (const JobOption& o : job_options()) {
    EXPECT_TRUE(flags.insert(o.flag()).second) << o.flag();
    EXPECT_FALSE(o.help.empty()) << o.key;
  }
  EXPECT_EQ(option("batch_size").flag(), "--batch-size");
}

TEST(JobConfigTest, DataParallelDegreesResolve) {
  const auto dims = [](JobConfig c, int64_t world = 0) { return data_parallel_dims(c, world); };
  // Nothing given: the default job's dp 2 (DDP).
  EXPECT_EQ(dims({}).dp_replicate, 2);
  EXPECT_EQ(dims({}).dp_shard, 1);
  // --dp is dp_replicate's shorthand; --dp-shard alone means no replicas.
  EXPECT_EQ(dims({.dp = 3}).dp_replicate, 3);
  EXPECT_EQ(dims({.dp_shard = 2}).dp_replicate, 1);
  EXPECT_EQ(dims({.dp = 2, .dp_shard = 2}).dp_replicate, 2);  // HSDP
  EXPECT_EQ(dims({.dp_replicate = 2, .dp_shard = 2}).world_size(), 8);
  // -1: what the others leave of the world.
  EXPECT_EQ(dims({.dp_shard = -1, .tp = 2, .pp = 2}, 16).dp_shard, 4);
  EXPECT_EQ(error_of([&] { dims({.dp_shard = -1}); }),
            "--dp-shard -1 takes the ranks the other degrees leave, but the number of ranks is "
            "not known: give --nproc N (or run under a launcher, which sets WORLD_SIZE)");
  EXPECT_EQ(error_of([&] { dims({.dp_shard = -1, .tp = 3}, 8); }),
            "ParallelDims: dp_shard -1 takes the ranks the other degrees leave, but pp=1 x "
            "dp_replicate=1 x cp=1 x tp=3 = 3 does not divide the world of 8");
  EXPECT_EQ(error_of([&] { dims({.dp = 2, .dp_replicate = 3}); }),
            "--dp is --dp-replicate's shorthand, but they differ: --dp 2 and --dp-replicate 3; "
            "give one");
  EXPECT_EQ(error_of([&] { dims({.dp_shard = 0}); }),
            "--dp-shard: expected a positive integer or -1 (the ranks the other degrees leave), "
            "got 0");
}

TEST(JobConfigTest, FileSetsItsKeysAndLeavesTheOthers) {
  JobConfig config;
  load_job_toml(config, write_file("job.toml", R"(
[parallel]
dp = 1
tp = 4
sequence_parallel = false
[training]
steps = 50
lr = 1e-3
clip = 2        # an integer is a fine float
[data]
data = "/tmp/text"
)"));
  EXPECT_EQ(config.dp, 1);
  EXPECT_EQ(config.tp, 4);
  EXPECT_FALSE(config.sequence_parallel);
  EXPECT_EQ(config.steps, 50);
  EXPECT_DOUBLE_EQ(config.lr, 1e-3);
  EXPECT_DOUBLE_EQ(config.clip, 2.0);
  EXPECT_EQ(config.data, "/tmp/text");
  EXPECT_EQ(config.batch_size, JobConfig{}.batch_size);  // not in the file
}

TEST(JobConfigTest, TheEffectiveConfigReadsBackToTheSameJob) {
  JobConfig changed;
  changed.model = "small";
  changed.lr = 0.0012345678901234;
  changed.save = "out dir/\"quoted\".safetensors";
  changed.progress = false;
  changed.clip = 1.0;
  const std::string text = to_toml(changed);
  EXPECT_THAT(text, HasSubstr("[training]\n"));
  EXPECT_THAT(text, HasSubstr("clip = 1.0\n"));
  JobConfig again;
  load_job_toml(again, write_file("effective.toml", text));
  EXPECT_EQ(to_toml(again), text);
  EXPECT_DOUBLE_EQ(again.lr, changed.lr);
  EXPECT_EQ(again.save, changed.save);
}

// The pipeline's split as a list, as torchtitan's job files write lists, or as the flag's text.
TEST(JobConfigTest, LayersPerStageIsAListOrItsText) {
  JobConfig config;
  load_job_toml(config, write_file("split.toml", "[parallel]\nlayers_per_stage = [3, 5, 5, 3]\n"));
  EXPECT_EQ(config.layers_per_stage, "3,5,5,3");
  EXPECT_EQ(parse_layers_per_stage(config.layers_per_stage, "x"),
            (std::vector<int64_t>{3, 5, 5, 3}));
  load_job_toml(config, write_file("split_text.toml", "[parallel]\nlayers_per_stage = \"1,7\"\n"));
  EXPECT_EQ(config.layers_per_stage, "1,7");
  const auto error = [&](const std::string& text) {
    return error_of([&] { load_job_toml(config, write_file("split_bad.toml", text)); });
  };
  EXPECT_THAT(error("[parallel]\nlayers_per_stage = [3, 0]\n"),
              HasSubstr("split_bad.toml: [parallel] layers_per_stage '3,0': expected positive "
                        "layer counts"));
  EXPECT_THAT(error("[parallel]\nlayers_per_stage = [3, \"x\"]\n"),
              HasSubstr("[parallel] layers_per_stage: expected an array of integers"));
  EXPECT_THAT(error("[parallel]\ntp = [2]\n"),
              HasSubstr("[parallel] tp: expected a single value, got an array"));
}

TEST(JobConfigTest, BadFilesAreNamedBySectionAndKey) {
  JobConfig config;
  const auto error = [&](const std::string& text) {
    const std::string path = write_file("bad.toml", text);
    return error_of([&] { load_job_toml(config, path); });
  };
  EXPECT_THAT(error("[training]\nstepz = 3\n"),
              HasSubstr("bad.toml: unknown key 'stepz' in [training]; its keys are steps, "
                        "batch_size, seq_len"));
  EXPECT_THAT(error("[trainig]\nsteps = 3\n"),
              HasSubstr("bad.toml: unknown section 'trainig'; the sections are [model], "
                        "[parallel], [training]"));
  EXPECT_THAT(error("steps = 3\n"), HasSubstr("unknown top-level key 'steps'"));
  EXPECT_THAT(error("[training]\nsteps = \"ten\"\n"),
              HasSubstr("bad.toml: [training] steps: expected an integer, got a string ('ten')"));
  EXPECT_THAT(error("[training]\nsteps = 0\n"),
              HasSubstr("bad.toml: [training] steps: expected a positive integer, got 0"));
  EXPECT_THAT(error("[training]\nseed = -1\n"),
              HasSubstr("[training] seed: expected a non-negative integer, got -1"));
  EXPECT_THAT(error("[training]\nlr = 1.5.0\n"), HasSubstr("bad.toml:2:"));
  EXPECT_THAT(error("[parallel]\nschedule = \"zigzag\"\n"),
              HasSubstr("[parallel] schedule: expected one of gpipe, 1f1b, zb-h1, interleaved, "
                        "zbv, dualpipev, got "
                        "'zigzag'"));
  // A form no list of choices holds is checked by the option's own parser, named by the key.
  EXPECT_THAT(error("[training]\nactivation_checkpoint = \"selective-layer:0\"\n"),
              HasSubstr("bad.toml: [training] activation_checkpoint: expected none, full, "
                        "selective-op or selective-layer:N"));
  EXPECT_THAT(error("[parallel]\nsequence_parallel = 1\n"),
              HasSubstr("[parallel] sequence_parallel: expected true or false, got an integer"));
  EXPECT_THAT(error("[training]\nsteps = [1, 2]\n"),
              HasSubstr("[training] steps: expected a single value, got an array"));
  EXPECT_THAT(error_of([&] { load_job_toml(config, "/no/such/job.toml"); }),
              HasSubstr("--config: cannot read the job file '/no/such/job.toml'"));
}

TEST(JobConfigTest, CommandLineTextIsParsedAndNamedByFlag) {
  JobConfig config;
  set_option(config, option("dp"), std::string("4"), "--dp");
  EXPECT_EQ(config.dp, 4);
  set_option(config, option("lr"), std::string("6e-4"), "--lr");
  EXPECT_DOUBLE_EQ(config.lr, 6e-4);
  EXPECT_EQ(error_of([&] { set_option(config, option("dp"), std::string("abc"), "--dp"); }),
            "--dp: expected a non-negative integer, got 'abc'");
  EXPECT_EQ(error_of([&] { set_option(config, option("lr"), std::string("0"), "--lr"); }),
            "--lr: expected a positive number, got '0'");
  EXPECT_EQ(error_of([&] { set_option(config, option("lr"), std::string("1e999"), "--lr"); }),
            "--lr: expected a positive number, got '1e999'");
  EXPECT_EQ(error_of([&] { set_option(config, option("seed"), std::string("-3"), "--seed"); }),
            "--seed: expected a non-negative integer, got '-3'");
  EXPECT_EQ(error_of([&] {
              set_option(config, option("sample_tokens"), std::string("-1"), "--sample-tokens");
            }),
            "--sample-tokens: expected a non-negative integer, got '-1'");
  EXPECT_EQ(error_of([&] { set_option(config, option("device"), std::string("tpu"), "--device"); }),
            "--device: expected one of auto, cpu, cuda, got 'tpu'");
}

}  // namespace
}  // namespace loom::train
