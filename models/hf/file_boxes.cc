#include "models/hf/file_boxes.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <vector>

#include "base/error.h"

namespace loom::models::hf {

namespace {

// An open file, closed on every path out.
class File {
 public:
  explicit File(const std::string& path) : path_(path), fd_(::open(path.c_str(), O_RDONLY)) {
    LOOM_CHECK(fd_ >= 0, "'{}': cannot open it: {}", path, std::strerror(errno));
  }
  ~File() { ::close(fd_); }
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  // Reads exactly `bytes` at `offset` into `out`.
  void read(uint64_t offset, size_t bytes, char* out) const {
    size_t done = 0;
    while (done < bytes) {
      const ssize_t n = ::pread(fd_, out + done, bytes - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      LOOM_CHECK(n > 0, "'{}': reading {} bytes at offset {} failed: {}", path_, bytes, offset,
                 n == 0 ? std::string("the file ends first") : std::strerror(errno));
      done += static_cast<size_t>(n);
    }
  }

 private:
  std::string path_;
  int fd_;
};

}  // namespace

Tensor read_box(const TensorSource& source, const StateDictAdapter::FileLayout& layout,
                const Shape& loom_shape, const Shape& offset, const Shape& shape,
                int64_t* bytes_read) {
  LOOM_CHECK(loom_shape.size() == 1 || loom_shape.size() == 2,
             "read_box: '{}' reads boxes of 1-D and 2-D tensors, got shape {}", source.file,
             shape_str(loom_shape));
  LOOM_CHECK(!layout.transposed || loom_shape.size() == 2,
             "read_box: a transposed layout needs a 2-D tensor, got shape {}",
             shape_str(loom_shape));
  const File file(source.file);
  const size_t element = element_size(source.dtype);
  Tensor out = Tensor::empty(shape, source.dtype);
  char* dst = static_cast<char*>(out.raw_data());
  const int64_t rows = shape[0];
  const int64_t cols = shape.size() == 2 ? shape[1] : 1;
  const int64_t col0 = shape.size() == 2 ? offset[1] : 0;
  const auto row_of = [&](int64_t r) {  // the file's row (before any transpose) of Loom's row r
    const int64_t global = offset[0] + r;
    return layout.row_source.empty() ? global : layout.row_source.at(global);
  };
  int64_t read = 0;
  if (!layout.transposed) {
    // Loom's row r is a run of `cols` elements of the file's row row_of(r); consecutive file rows
    // whose runs touch join into one read.
    const int64_t width = loom_shape.size() == 2 ? loom_shape[1] : 1;
    int64_t r = 0;
    while (r < rows) {
      int64_t end = r + 1;
      while (end < rows && cols == width && row_of(end) == row_of(end - 1) + 1) ++end;
      const uint64_t first = static_cast<uint64_t>(row_of(r) * width + col0);
      const size_t bytes = static_cast<size_t>((end - r) * cols) * element;
      file.read(source.offset + first * element, bytes, dst + r * cols * element);
      read += static_cast<int64_t>(bytes);
      r = end;
    }
  } else {
    // Loom's (r, c) is the file's (c, row_of(r)): for each file row c of the box, the columns
    // row_of(r) of the box's rows, read as runs of consecutive columns.
    const int64_t file_width = loom_shape[0];
    std::vector<int64_t> order(static_cast<size_t>(rows));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](int64_t a, int64_t b) { return row_of(a) < row_of(b); });
    std::vector<char> run;
    for (int64_t c = 0; c < cols; ++c) {
      const uint64_t file_row = static_cast<uint64_t>(col0 + c) * file_width;
      size_t i = 0;
      while (i < order.size()) {
        size_t end = i + 1;
        while (end < order.size() && row_of(order[end]) == row_of(order[end - 1]) + 1) ++end;
        const size_t bytes = (end - i) * element;
        run.resize(bytes);
        file.read(source.offset + (file_row + row_of(order[i])) * element, bytes, run.data());
        for (size_t k = i; k < end; ++k) {
          std::memcpy(dst + (order[k] * cols + c) * element, run.data() + (k - i) * element,
                      element);
        }
        read += static_cast<int64_t>(bytes);
        i = end;
      }
    }
  }
  if (bytes_read != nullptr) *bytes_read += read;
  return out;
}

}  // namespace loom::models::hf
