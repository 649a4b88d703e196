// TEMPORARY stand-in until the durable-write helper lands (replaced by the real one).
#pragma once
#include <string>
#include <string_view>
namespace loom {
void write_file_atomically(const std::string& path, std::string_view bytes, std::string_view what);
}
