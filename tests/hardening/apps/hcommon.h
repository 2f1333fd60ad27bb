// hcommon.h: small helpers for the hardening test programs (tests/hardening).
// The programs are plain CUDA runtime clients: they know nothing of lazypin and
// print what they saw, so a test can compare a run under the shim with a run
// without it.
#pragma once
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <time.h>
#include <unistd.h>

namespace hard {

inline const size_t kPage = 4096;

inline double now_s() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Exit 3 with a message when a CUDA code is not the one the driver semantics imply.
inline void expect(int got, int want, const char* what, int line) {
  if (got != want) {
    std::fprintf(stderr, "UNEXPECTED line %d: %s -> %d, expected %d\n", line, what, got, want);
    std::fflush(stdout);
    std::_Exit(3);
  }
}
#define EXPECT(call, want) ::hard::expect(static_cast<int>(call), (want), #call, __LINE__)

// Stamp, copy H2D and back through a device buffer, and verify. Exit 2 on a mismatch.
inline void roundtrip(unsigned char* host, size_t n, void* dev, unsigned char* check,
                      unsigned seed) {
  for (size_t i = 0; i < n; i += 512) host[i] = static_cast<unsigned char>(seed + i / 512);
  host[n - 1] = static_cast<unsigned char>(seed * 7 + 1);
  EXPECT(cudaMemcpy(dev, host, n, cudaMemcpyHostToDevice), 0);
  EXPECT(cudaMemcpy(check, dev, n, cudaMemcpyDeviceToHost), 0);
  for (size_t i = 0; i < n; i += 512) {
    if (check[i] != host[i]) {
      std::fprintf(stderr, "DATA MISMATCH at %zu\n", i);
      std::_Exit(2);
    }
  }
  if (check[n - 1] != host[n - 1]) {
    std::fprintf(stderr, "DATA MISMATCH at end\n");
    std::_Exit(2);
  }
}

inline double arg_double(int argc, char** argv, const char* name, double def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atof(argv[i + 1]);
  return def;
}
inline bool arg_flag(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}

}  // namespace hard
