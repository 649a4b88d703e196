// safetensors: round trips of every dtype Loom has, and every kind of bad file rejected with a
// message that names the file and the tensor.
#include "models/hf/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "base/error.h"
#include "tensor/ops.h"
#include "tests/testing/tensor_checks.h"

namespace loom::models {
namespace {

using loom::testing::expect_bitwise_equal;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "/" + name; }

// Writes a file by hand: the 8-byte length (or `length_override`), the header text, the buffer.
void write_raw(const std::string& path, const std::string& header, const std::string& buffer,
               std::optional<uint64_t> length_override = std::nullopt) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t length = length_override.value_or(header.size());
  out.write(reinterpret_cast<const char*>(&length), 8);
  out << header << buffer;
}

std::string bytes_of(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

// Runs load_safetensors and returns the error message ("" if it did not throw).
std::string load_error(const std::string& path) {
  try {
    load_safetensors(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SafetensorsTest, RoundTripsEveryDTypeAndMetadata) {
  const Tensor f32 = ops::normal({3, 5}, 1, 0.0, 1.0);
  TensorMap tensors{
      {"a.f32", f32},
      {"b.bf16",
       ops::to(ops::normal({7}, 2, 0.0, 1.0), kBFloat16)},  // 14 bytes: the next tensor is padded
      {"c.f16", ops::to(ops::normal({2, 3, 1}, 3, 0.0, 1.0), kFloat16)},
      {"d.i32", ops::to(ops::from_vector_i64({1, -2, 3}, {3}), kInt32)},
      {"e.i64", ops::from_vector_i64({-5, 1LL << 40}, {2})},
      {"f.scalar", ops::scalar_tensor(2.5)},
      {"g.empty", ops::zeros({0, 4})},
      {"h.transposed", ops::transpose(f32, 0, 1)},  // non-contiguous input is written row-major
  };
  const std::string path = temp_path("round_trip.safetensors");
  save_safetensors(path, tensors, {{"format", "pt"}, {"note", "loom"}});
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  const SafetensorsFile file = load_safetensors(path);
  ASSERT_EQ(file.tensors.size(), tensors.size());
  for (const auto& [name, tensor] : tensors) {
    expect_bitwise_equal({.actual = file.tensors.at(name), .expected = tensor, .what = name});
  }
  EXPECT_EQ(file.metadata, (SafetensorsMetadata{{"format", "pt"}, {"note", "loom"}}));
}

TEST(SafetensorsTest, ReadsAHandWrittenFile) {
  // The format as the spec describes it, written without the code under test.
  const std::string path = temp_path("hand.safetensors");
  write_raw(path,
            R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"k":"v"}})",
            bytes_of({1.5f, -2.0f}));
  const SafetensorsFile file = load_safetensors(path);
  EXPECT_EQ(ops::to_vector(file.tensors.at("w")), (std::vector<double>{1.5, -2.0}));
  EXPECT_EQ(file.metadata.at("k"), "v");
}

TEST(SafetensorsTest, OverwriteIsAtomicAndReplacesTheFile) {
  const std::string path = temp_path("overwrite.safetensors");
  save_safetensors(path, {{"x", ops::ones({4})}});
  save_safetensors(path, {{"y", ops::zeros({2})}});
  const SafetensorsFile file = load_safetensors(path);
  EXPECT_EQ(file.tensors.size(), 1u);
  EXPECT_TRUE(file.tensors.count("y"));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

// A save killed mid-write by SIGKILL (or a crash) leaves <path>.tmp behind; the next successful
// save writes the same temporary name and renames it, so nothing stale outlives it.
TEST(SafetensorsTest, AKilledSavesTemporaryDoesNotOutliveTheNextSave) {
  const std::string path = temp_path("killed.safetensors");
  std::ofstream(path + ".tmp") << "half a file from a save that was killed";
  save_safetensors(path, {{"x", ops::ones({4})}});
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  EXPECT_TRUE(load_safetensors(path).tensors.count("x"));
}

TEST(SafetensorsTest, RejectsAFileTooShortForTheLength) {
  const std::string path = temp_path("short.safetensors");
  std::ofstream(path, std::ios::binary) << "abc";
  EXPECT_THAT(load_error(path), AllOf(HasSubstr(path), HasSubstr("too short")));
}

TEST(SafetensorsTest, RejectsAHeaderLengthBeyondTheFile) {
  // Wrong magic: a text file read as a length gives an absurd header size.
  const std::string path = temp_path("magic.safetensors");
  std::ofstream(path, std::ios::binary) << "hello world, not a checkpoint";
  EXPECT_THAT(load_error(path), AllOf(HasSubstr(path), HasSubstr("header length")));
  write_raw(path, R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", bytes_of({1}), 1000);
  EXPECT_THAT(load_error(path), AllOf(HasSubstr(path), HasSubstr("header length 1000 exceeds")));
}

TEST(SafetensorsTest, RejectsGarbageJson) {
  const std::string path = temp_path("garbage.safetensors");
  write_raw(path, R"({"w": {"dtype": "F32", )", "");
  EXPECT_THAT(load_error(path), AllOf(HasSubstr(path), HasSubstr("not valid JSON")));
  write_raw(path, R"([1, 2, 3])", "");
  EXPECT_THAT(load_error(path), AllOf(HasSubstr(path), HasSubstr("must be a JSON object")));
}

TEST(SafetensorsTest, RejectsTruncatedData) {
  const std::string path = temp_path("truncated.safetensors");
  save_safetensors(path, {{"a", ops::ones({4})}, {"b", ops::ones({16})}});
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 4);
  EXPECT_THAT(load_error(path),
              AllOf(HasSubstr(path), HasSubstr("tensor 'b'"), HasSubstr("out of range")));
}

TEST(SafetensorsTest, RejectsOffsetsOutOfRange) {
  const std::string path = temp_path("range.safetensors");
  write_raw(path, R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", bytes_of({1, 2}));
  EXPECT_THAT(load_error(path),
              AllOf(HasSubstr(path), HasSubstr("tensor 'w'"), HasSubstr("out of range")));
  write_raw(path, R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", bytes_of({1, 2}));
  EXPECT_THAT(load_error(path), AllOf(HasSubstr("tensor 'w'"), HasSubstr("end before they begin")));
  write_raw(path, R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[-1,7]}})", bytes_of({1, 2}));
  EXPECT_THAT(load_error(path), AllOf(HasSubstr("tensor 'w'"), HasSubstr("data_offsets")));
}

TEST(SafetensorsTest, RejectsOverlappingTensors) {
  const std::string path = temp_path("overlap.safetensors");
  write_raw(path,
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            bytes_of({1, 2, 3}));
  EXPECT_THAT(load_error(path),
              AllOf(HasSubstr(path), HasSubstr("tensor 'b'"), HasSubstr("overlaps tensor 'a'")));
}

TEST(SafetensorsTest, RejectsSizesInconsistentWithShapeAndDType) {
  const std::string path = temp_path("size.safetensors");
  write_raw(path, R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", bytes_of({1, 2}));
  EXPECT_THAT(load_error(path),
              AllOf(HasSubstr(path), HasSubstr("tensor 'w'"), HasSubstr("span 8 bytes"),
                    HasSubstr("shape (3,) of F32 needs 12 bytes")));
  write_raw(path, R"({"w":{"dtype":"BF16","shape":[2],"data_offsets":[0,8]}})", bytes_of({1, 2}));
  EXPECT_THAT(load_error(path), AllOf(HasSubstr("tensor 'w'"), HasSubstr("needs 4 bytes")));
}

TEST(SafetensorsTest, RejectsUnknownDTypesAndMalformedEntries) {
  const std::string path = temp_path("dtype.safetensors");
  write_raw(path, R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", bytes_of({1, 2}));
  EXPECT_THAT(load_error(path), AllOf(HasSubstr(path), HasSubstr("tensor 'w'"),
                                      HasSubstr("\"F64\" is not supported")));
  write_raw(path, R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", bytes_of({1}));
  EXPECT_THAT(load_error(path), AllOf(HasSubstr("tensor 'w'"), HasSubstr("no \"shape\"")));
  write_raw(path, R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", bytes_of({1}));
  EXPECT_THAT(load_error(path), AllOf(HasSubstr("tensor 'w'"), HasSubstr("non-negative")));
  write_raw(path, R"({"__metadata__":{"k":1}})", "");
  EXPECT_THAT(load_error(path), AllOf(HasSubstr(path), HasSubstr("__metadata__")));
}

TEST(SafetensorsTest, WriterRejectsReservedNames) {
  EXPECT_THROW(
      save_safetensors(temp_path("reserved.safetensors"), {{"__metadata__", ops::ones({1})}}),
      Error);
  EXPECT_FALSE(std::filesystem::exists(temp_path("reserved.safetensors.tmp")));
}

TEST(SafetensorsTest, MissingFileIsNamed) {
  EXPECT_THAT(load_error(temp_path("does_not_exist.safetensors")),
              AllOf(HasSubstr("does_not_exist.safetensors"), HasSubstr("cannot open")));
}

}  // namespace
}  // namespace loom::models
