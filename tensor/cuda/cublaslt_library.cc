#include "tensor/cuda/cublaslt_library.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <string>

#include "base/error.h"

namespace loom::cuda {

namespace {

void* open_library(const std::string& name) {
  std::string errors;
  for (const std::string& path : {name, "/usr/local/cuda/lib64/" + name}) {
    if (void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return handle;
    errors += fmt::format("{}{}", errors.empty() ? "" : "; ", dlerror());
  }
  LOOM_FAIL(
      "cuBLASLt: cannot load {} (tried the loader's search path and /usr/local/cuda/lib64): {}",
      name, errors);
}

template <typename F>
void resolve(void* library, const char* symbol, F& out) {
  out = reinterpret_cast<F>(dlsym(library, symbol));
  LOOM_CHECK(out != nullptr, "cuBLASLt: the loaded library lacks {}: {}", symbol, dlerror());
}

CublasLtApi load() {
  void* library = open_library(fmt::format("libcublasLt.so.{}", CUBLAS_VER_MAJOR));
  CublasLtApi api{};
#define LOOM_RESOLVE(name) resolve(library, "cublasLt" #name, api.name)
  LOOM_RESOLVE(Create);
  LOOM_RESOLVE(GetStatusName);
  LOOM_RESOLVE(GetStatusString);
  LOOM_RESOLVE(Matmul);
  LOOM_RESOLVE(MatmulAlgoGetHeuristic);
  LOOM_RESOLVE(MatmulDescCreate);
  LOOM_RESOLVE(MatmulDescSetAttribute);
  LOOM_RESOLVE(MatmulPreferenceCreate);
  LOOM_RESOLVE(MatmulPreferenceDestroy);
  LOOM_RESOLVE(MatmulPreferenceSetAttribute);
  LOOM_RESOLVE(MatrixLayoutCreate);
  LOOM_RESOLVE(MatrixLayoutSetAttribute);
#undef LOOM_RESOLVE
  return api;  // the library stays loaded for the process's lifetime
}

}  // namespace

const CublasLtApi& cublaslt() {
  static const CublasLtApi api = load();  // thread-safe; a failed load throws and retries next call
  return api;
}

}  // namespace loom::cuda
