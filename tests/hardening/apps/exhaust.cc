// exhaust.cc: registrations that fail for lack of memory. Run on the
// memlimit stand-in driver (apps/memlimit/libcuda.so.1, MEMLIMIT_BYTES) with
// --buffers N buffers of 1 MiB where N MiB is the limit. Phases:
//   1. register + copy + unregister each of the N buffers (lazypin's defer mode
//      pools them all: the driver still holds N MiB);
//   2. register a new buffer: without lazypin 0; with it the driver says out of
//      memory, and lazypin must make room (evict) and retry, so 0 again;
//   3. register N buffers and keep them, then one more: out of memory (2) both
//      ways, and the last error too;
//   4. unregister everything, register again: 0.
// Prints every code; the output must be the same with and without lazypin.
//
// exhaust --big-free MIB: 3 rounds of a MIB-sized malloc'd buffer, touched,
// registered, copied and unregistered (pooled under lazypin), then freed;
// prints whether the process's resident memory dropped by at least half of it
// by the time free() returned (lazypin hands pooled frees to its thread, but
// waits once more than 64 MiB are pending, so big frees stay synchronous).
#include "hcommon.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>

#include <vector>

size_t ResidentBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  unsigned long size = 0, resident = 0;
  if (f != nullptr) {
    if (std::fscanf(f, "%lu %lu", &size, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return resident * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

int BigFree(size_t bytes) {
  void* dev = nullptr;
  EXPECT(cudaMalloc(&dev, 1 << 20), 0);
  for (int round = 0; round < 3; ++round) {
    auto* p = static_cast<unsigned char*>(std::malloc(bytes));
    if (p == nullptr) return 1;
    std::memset(p, round + 1, bytes);
    const int r1 = cudaHostRegister(p, bytes, 0);
    const int c = cudaMemcpy(dev, p, 1 << 20, cudaMemcpyHostToDevice);
    const int r2 = cudaHostUnregister(p);
    const size_t before = ResidentBytes();
    std::free(p);
    const size_t after = ResidentBytes();
    std::printf("big-free round %d register=%d copy=%d unregister=%d released=%s\n", round, r1, c,
                r2, before > after && before - after >= bytes / 2 ? "yes" : "no");
  }
  return 0;
}

int main(int argc, char** argv) {
  const double big = hard::arg_double(argc, argv, "--big-free", 0);
  if (big > 0) return BigFree(static_cast<size_t>(big) << 20);
  const int n = static_cast<int>(hard::arg_double(argc, argv, "--buffers", 4));
  const size_t kN = 1 << 20;
  void* dev = nullptr;
  EXPECT(cudaMalloc(&dev, kN), 0);
  auto* check = static_cast<unsigned char*>(std::malloc(kN));
  std::vector<unsigned char*> bufs;
  for (int i = 0; i < n + 2; ++i) {
    void* p = nullptr;
    if (posix_memalign(&p, hard::kPage, kN)) return 1;
    bufs.push_back(static_cast<unsigned char*>(p));
  }
  auto show = [](const char* what, int i, int rc) {
    std::printf("%s %d -> %d last=%d\n", what, i, rc, static_cast<int>(cudaGetLastError()));
  };
  for (int i = 0; i < n; ++i) {
    int rc = cudaHostRegister(bufs[i], kN, 0);
    show("phase1 register", i, rc);
    if (rc == 0) hard::roundtrip(bufs[i], kN, dev, check, static_cast<unsigned>(i));
    show("phase1 unregister", i, cudaHostUnregister(bufs[i]));
  }
  int rc = cudaHostRegister(bufs[n], kN, 0);
  show("phase2 register new", n, rc);
  if (rc == 0) hard::roundtrip(bufs[n], kN, dev, check, 77);
  show("phase2 unregister new", n, cudaHostUnregister(bufs[n]));
  for (int i = 0; i < n; ++i) show("phase3 register keep", i, cudaHostRegister(bufs[i], kN, 0));
  show("phase3 register one more", n + 1, cudaHostRegister(bufs[n + 1], kN, 0));
  show("phase3 register one more again", n + 1, cudaHostRegister(bufs[n + 1], kN, 0));
  for (int i = 0; i < n; ++i) show("phase4 unregister", i, cudaHostUnregister(bufs[i]));
  rc = cudaHostRegister(bufs[n + 1], kN, 0);
  show("phase4 register", n + 1, rc);
  if (rc == 0) hard::roundtrip(bufs[n + 1], kN, dev, check, 78);
  show("phase4 unregister", n + 1, cudaHostUnregister(bufs[n + 1]));
  for (auto* p : bufs) std::free(p);
  std::printf("EXHAUST ok\n");
  return 0;
}
