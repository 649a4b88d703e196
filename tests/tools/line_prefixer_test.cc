#include "tools/loomrun/line_prefixer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace loom::loomrun {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

struct Recorder {
  std::vector<std::string> writes;
  LinePrefixer::Sink sink() {
    return [this](std::string_view s) { writes.emplace_back(s); };
  }
};

TEST(LinePrefixerTest, PrefixesEveryCompleteLineInOneWritePerChunk) {
  Recorder recorder;
  LinePrefixer prefixer("[rank 2] ", recorder.sink());
  prefixer.feed("a\nbb\n");
  EXPECT_THAT(recorder.writes, ElementsAre("[rank 2] a\n[rank 2] bb\n"));
}

TEST(LinePrefixerTest, HoldsAPartialLineUntilItsNewlineArrives) {
  Recorder recorder;
  LinePrefixer prefixer("[rank 0] ", recorder.sink());
  prefixer.feed("hel");
  prefixer.feed("lo");
  EXPECT_THAT(recorder.writes, IsEmpty());
  EXPECT_EQ(prefixer.pending_bytes(), 5u);
  prefixer.feed(" world\nnext");
  EXPECT_THAT(recorder.writes, ElementsAre("[rank 0] hello world\n"));
  EXPECT_EQ(prefixer.pending_bytes(), 4u);
}

TEST(LinePrefixerTest, FinishFlushesTheLastLineWithANewlineOnce) {
  Recorder recorder;
  LinePrefixer prefixer("[rank 1] ", recorder.sink());
  prefixer.feed("done\nno newline");
  prefixer.finish();
  prefixer.finish();
  EXPECT_THAT(recorder.writes, ElementsAre("[rank 1] done\n", "[rank 1] no newline\n"));
}

TEST(LinePrefixerTest, FinishWithNothingPendingWritesNothing) {
  Recorder recorder;
  LinePrefixer prefixer("[rank 1] ", recorder.sink());
  prefixer.feed("line\n");
  prefixer.finish();
  EXPECT_THAT(recorder.writes, ElementsAre("[rank 1] line\n"));
}

TEST(LinePrefixerTest, KeepsEmptyLinesAndCarriageReturns) {
  Recorder recorder;
  LinePrefixer prefixer("> ", recorder.sink());
  prefixer.feed("\n\r\nx\n");
  EXPECT_THAT(recorder.writes, ElementsAre("> \n> \r\n> x\n"));
}

TEST(LinePrefixerTest, SplitsALineLongerThanTheLimit) {
  Recorder recorder;
  LinePrefixer prefixer("| ", recorder.sink(), /*max_line_bytes=*/4);
  prefixer.feed("abcdefghij\nxy");
  EXPECT_THAT(recorder.writes, ElementsAre("| abcd\n| efgh\n| ij\n"));
  prefixer.feed("zw");  // reaches the limit exactly
  prefixer.feed("\n");
  EXPECT_THAT(recorder.writes, ElementsAre("| abcd\n| efgh\n| ij\n", "| xyzw\n", "| \n"));
}

TEST(LinePrefixerTest, ByteAtATimeGivesTheSameLines) {
  Recorder recorder;
  LinePrefixer prefixer("[rank 3] ", recorder.sink());
  for (char c : std::string("one\ntwo\n")) prefixer.feed(std::string_view(&c, 1));
  EXPECT_THAT(recorder.writes, ElementsAre("[rank 3] one\n", "[rank 3] two\n"));
}

}  // namespace
}  // namespace loom::loomrun
