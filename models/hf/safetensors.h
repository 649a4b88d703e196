// The safetensors file format (Hugging Face): a generic reader and writer of named tensors.
//
//   [8 bytes: N, little-endian u64] [N bytes: JSON header] [byte buffer]
//   header = {"NAME": {"dtype": "F32", "shape": [2, 3], "data_offsets": [BEGIN, END]}, ...,
//             "__metadata__": {"KEY": "VALUE", ...}}          (metadata optional, strings only)
//   BEGIN/END are byte offsets into the buffer (after the header); END - BEGIN = numel * size.
//
// Loom reads and writes the dtypes it has: F32, BF16, F16, I32, I64 (little-endian, as the
// format and every machine Loom runs on are).
//
// The reader validates the whole header before reading any data: the header length fits the
// file, the JSON parses and has the fields above, the dtype is known, byte sizes equal
// numel * element size, offsets lie inside the buffer, and no two tensors overlap (gaps are
// tolerated). Every error is a loom::Error naming the file and, where there is one, the tensor.
//
// The writer is atomic (base/durable_file.h): it writes PATH.tmp, fsyncs it, renames it over PATH
// and fsyncs the folder, so PATH is either the old file or the complete new one; SIGINT or SIGTERM
// during the write removes PATH.tmp. Tensors are written in name
// order, each at an 8-byte-aligned offset (the header is padded with spaces to a multiple of 8).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "tensor/tensor.h"

namespace loom::models {

// Name -> tensor (CPU, any layout; DTensors are rejected: gather them with full_tensor first).
using TensorMap = std::map<std::string, Tensor>;
using SafetensorsMetadata = std::map<std::string, std::string>;

// Where a tensor's bytes are: the file, the byte offset of its first element in it, its dtype and
// shape (row-major, contiguous).
struct TensorSource {
  std::string file;
  uint64_t offset = 0;
  DType dtype = kFloat32;
  Shape shape;
};

struct SafetensorsFile {
  TensorMap tensors;  // fresh contiguous CPU tensors
  SafetensorsMetadata metadata;
  std::map<std::string, TensorSource> sources;  // every tensor's, values read or not
};

// Writes `tensors` (and `metadata` as "__metadata__") to `path` atomically.
void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const SafetensorsMetadata& metadata = {});

// Reads and validates the whole file; throws loom::Error naming the file (and tensor) when
// anything is wrong. Nothing is returned unless the whole file is valid. With `values` false only
// the header is read (validated the same): the tensors are on the meta device, shapes and dtypes
// without values (what a check before a job starts reads of a checkpoint of any size).
// With `only`, values are read for the tensors it names alone (the others are meta tensors).
SafetensorsFile load_safetensors(const std::string& path, bool values = true,
                                 const std::set<std::string>* only = nullptr);

// "F32", "BF16", "F16", "I32", "I64".
std::string safetensors_dtype_name(DType dtype);

}  // namespace loom::models
