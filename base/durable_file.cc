#include "base/durable_file.h"

#include <cstdio>
#include <fstream>

#include "base/error.h"
namespace loom {
void write_file_atomically(const std::string& path, std::string_view bytes, std::string_view what) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    LOOM_CHECK(out.is_open(), "{}: cannot write '{}'", what, tmp);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    LOOM_CHECK(!out.fail(), "{}: writing '{}' failed", what, tmp);
  }
  LOOM_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "{}: cannot move '{}' to '{}'", what, tmp,
             path);
}
}  // namespace loom
