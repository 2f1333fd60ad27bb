// cudalib.cc: a shared library that uses CUDA, for reentry dlopen. It is
// dlopen'ed after start, registers / copies / unregisters its own buffers
// (pooled under lazypin's defer mode), and frees one of them from a static
// destructor when dlclose'd.
#include "hcommon.h"

namespace {
unsigned char* g_keep = nullptr;
struct Keep {
  ~Keep() {
    std::free(g_keep);  // pooled memory leaves at dlclose
    g_keep = nullptr;
  }
} g_keep_dtor;
}  // namespace

extern "C" int cudalib_cycle(int rounds) {
  const size_t n = 512 * 1024;
  void* dev = nullptr;
  if (int rc = cudaMalloc(&dev, n)) return rc;
  auto* check = static_cast<unsigned char*>(std::malloc(n));
  for (int i = 0; i < rounds; ++i) {
    auto* p = static_cast<unsigned char*>(std::malloc(n));
    for (int k = 0; k < 2; ++k) {  // the second register is a pool hit under defer
      if (int rc = cudaHostRegister(p, n, 0)) return rc;
      hard::roundtrip(p, n, dev, check, static_cast<unsigned>(i * 2 + k));
      if (int rc = cudaHostUnregister(p)) return rc;
    }
    std::free(p);
  }
  if (g_keep == nullptr) {
    g_keep = static_cast<unsigned char*>(std::malloc(n));
    if (int rc = cudaHostRegister(g_keep, n, 0)) return rc;
    if (int rc = cudaHostUnregister(g_keep)) return rc;
  }
  std::free(check);
  cudaFree(dev);
  return 0;
}
