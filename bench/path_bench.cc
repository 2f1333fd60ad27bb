// path_bench: the program's view of each path lazypin takes, through the
// runtime as a program calls it (cudaHostRegister / cudaHostUnregister of the
// shared cudart), so that the whole path is in the figure: the runtime hook,
// Dispatch, the pool, the kernel watch's drain, the record into the log ring.
// Run it once plain and once under LD_PRELOAD=liblazypin.so with
// LAZYPIN_MODE=defer, on the simulated stack (SIMCUDA_SLEEP=0 SIMCUDA_PIN=0)
// or a GPU; the difference is lazypin's. From the build directory:
//   LD_LIBRARY_PATH=$PWD/simcuda SIMCUDA_SLEEP=0 SIMCUDA_PIN=0 ./bench/path_bench
//   LD_PRELOAD=$PWD/shim/liblazypin.so LAZYPIN_MODE=defer LAZYPIN_SUMMARY=0
//     LD_LIBRARY_PATH=$PWD/simcuda SIMCUDA_SLEEP=0 SIMCUDA_PIN=0 ./bench/path_bench
// (--benchmark_repetitions=3 for spreads). PATH_BENCH_NO_STAMP=1 leaves the
// pages alone between calls: the cache and TLB effect of the program's own
// writes, which is what grows with the size.
//  - BM_Hit/<bytes>: a register served from the pool (defer) or made by the
//    driver (plain), with the buffer's pages written before each call, as
//    testapps/loop does (so caches and TLB are what a program leaves them);
//  - BM_Defer/<bytes>: the unregister after it, deferred (defer) or real;
//  - BM_Miss/<bytes>: a first register of a buffer in a mapping of many,
//    each registered once (testapps/many's pattern), then unregistered
//    outside the timing; no two at the same address;
//  - BM_ForkPooled/<bytes>: fork() (the parent's side; the child exits at
//    once) after the program registered and unregistered <bytes>: under
//    defer the pool releases it first;
//  - BM_Part/<name>: each call a hit or a deferral may make, alone, warm
//    (clock_gettime, cuCtxGetCurrent, cuCtxGetDevice, cuCtxSynchronize on an
//    idle context, cuThreadExchangeStreamCaptureMode, a read(2) of an empty
//    userfaultfd): the parts the whole path is made of, on this machine.
// Each reports manual time per call (ns).
#include <benchmark/benchmark.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>

namespace {

double NowS() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "path_bench: %s: %d\n", what, static_cast<int>(e));
    abort();
  }
}

void SetUp() {
  static bool done = [] {
    Check(cudaFree(nullptr), "cudaFree(nullptr)");  // the context, outside the timing
    return true;
  }();
  (void)done;
}

unsigned char* Map(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) abort();
  return static_cast<unsigned char*>(p);
}

// Writes 8 bytes into every 4 KiB page (testapps/common.h stamp_pages).
void Stamp(unsigned char* buf, size_t bytes, uint64_t tag) {
  static const bool skip = getenv("PATH_BENCH_NO_STAMP") != nullptr;
  if (skip && tag > 1) return;
  for (size_t off = 0; off < bytes; off += 4096) __builtin_memcpy(buf + off, &tag, 8);
}

void BM_Hit(benchmark::State& state) {
  SetUp();
  const size_t bytes = static_cast<size_t>(state.range(0));
  unsigned char* buf = Map(bytes);
  Stamp(buf, bytes, 1);
  Check(cudaHostRegister(buf, bytes, 0), "register");  // the miss, outside the timing
  Check(cudaHostUnregister(buf), "unregister");
  uint64_t tag = 2;
  for (auto _ : state) {
    Stamp(buf, bytes, tag++);
    const double t0 = NowS();
    const cudaError_t e = cudaHostRegister(buf, bytes, 0);
    state.SetIterationTime(NowS() - t0);
    Check(e, "register");
    Check(cudaHostUnregister(buf), "unregister");
  }
  munmap(buf, bytes);
}

void BM_Defer(benchmark::State& state) {
  SetUp();
  const size_t bytes = static_cast<size_t>(state.range(0));
  unsigned char* buf = Map(bytes);
  Stamp(buf, bytes, 1);
  Check(cudaHostRegister(buf, bytes, 0), "register");
  Check(cudaHostUnregister(buf), "unregister");
  uint64_t tag = 2;
  for (auto _ : state) {
    Check(cudaHostRegister(buf, bytes, 0), "register");
    Stamp(buf, bytes, tag++);
    const double t0 = NowS();
    const cudaError_t e = cudaHostUnregister(buf);
    state.SetIterationTime(NowS() - t0);
    Check(e, "unregister");
  }
  munmap(buf, bytes);
}

void BM_Miss(benchmark::State& state) {
  SetUp();
  const size_t bytes = static_cast<size_t>(state.range(0));
  constexpr size_t kBuffers = 256;
  // A fresh mapping usually lands where the last one was: its buffers start
  // `shift` pages in, one more each time (up to 63), so that no buffer has
  // the address of an earlier one (a new buffer to anything keyed by address).
  constexpr size_t kShifts = 64;
  static size_t shift = 0;
  const size_t map_bytes = kBuffers * bytes + kShifts * 4096;
  unsigned char* map = nullptr;
  unsigned char* area = nullptr;
  size_t next = kBuffers;
  for (auto _ : state) {
    if (next == kBuffers) {  // a fresh mapping: nothing of it registered or pooled
      state.PauseTiming();
      if (map != nullptr) munmap(map, map_bytes);
      map = Map(map_bytes);
      area = map + (shift++ % kShifts) * 4096;
      Stamp(area, kBuffers * bytes, 1);
      next = 0;
      state.ResumeTiming();
    }
    unsigned char* buf = area + next++ * bytes;
    const double t0 = NowS();
    const cudaError_t e = cudaHostRegister(buf, bytes, 0);
    state.SetIterationTime(NowS() - t0);
    Check(e, "register");
    Check(cudaHostUnregister(buf), "unregister");
  }
  if (map != nullptr) munmap(map, map_bytes);
}

void BM_ForkPooled(benchmark::State& state) {
  SetUp();
  const size_t bytes = static_cast<size_t>(state.range(0));
  unsigned char* buf = Map(bytes);
  Stamp(buf, bytes, 1);
  for (auto _ : state) {
    Check(cudaHostRegister(buf, bytes, 0), "register");
    Check(cudaHostUnregister(buf), "unregister");
    const double t0 = NowS();
    const pid_t pid = fork();
    if (pid == 0) _exit(0);
    state.SetIterationTime(NowS() - t0);
    if (pid < 0) abort();
    int status = 0;
    waitpid(pid, &status, 0);
  }
  munmap(buf, bytes);
}

// One of the calls a hit or deferral makes, timed alone (CPU time per call).
enum Part { kClock, kCtxGetCurrent, kCtxGetDevice, kCtxSynchronize, kCaptureMode, kUffdRead };

int OpenWatchedUffd(void** page) {
  const int fd = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
  if (fd < 0) return -1;
  uffdio_api api = {UFFD_API, UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMOVE, 0};
  *page = mmap(nullptr, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  uffdio_register reg = {{reinterpret_cast<uintptr_t>(*page), 1 << 16}, UFFDIO_REGISTER_MODE_WP, 0};
  if (ioctl(fd, UFFDIO_API, &api) != 0 || ioctl(fd, UFFDIO_REGISTER, &reg) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

void BM_Part(benchmark::State& state) {
  SetUp();
  const Part part = static_cast<Part>(state.range(0));
  void* page = nullptr;
  const int fd = part == kUffdRead ? OpenWatchedUffd(&page) : -1;
  if (part == kUffdRead && fd < 0) {
    state.SkipWithError("userfaultfd refused");
    return;
  }
  CUcontext ctx = nullptr;
  CUdevice dev = 0;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  uffd_msg msg[16];
  timespec ts;
  for (auto _ : state) {
    switch (part) {
      case kClock: clock_gettime(CLOCK_MONOTONIC, &ts); break;
      case kCtxGetCurrent: cuCtxGetCurrent(&ctx); break;
      case kCtxGetDevice: cuCtxGetDevice(&dev); break;
      case kCtxSynchronize: cuCtxSynchronize(); break;
      case kCaptureMode: cuThreadExchangeStreamCaptureMode(&mode); break;
      case kUffdRead: benchmark::DoNotOptimize(read(fd, msg, sizeof msg)); break;
    }
  }
  static const char* const kNames[] = {"clock_gettime", "cuCtxGetCurrent", "cuCtxGetDevice",
                                       "cuCtxSynchronize", "cuThreadExchangeStreamCaptureMode",
                                       "read(userfaultfd)"};
  state.SetLabel(kNames[part]);
  if (fd >= 0) {
    close(fd);
    munmap(page, 1 << 16);
  }
}
BENCHMARK(BM_Part)->DenseRange(kClock, kUffdRead);

#define LAZYPIN_SIZES(bm)                                                            \
  BENCHMARK(bm)->Arg(4 << 10)->Iterations(20000)->UseManualTime()->Unit(benchmark::kMicrosecond); \
  BENCHMARK(bm)->Arg(4 << 20)->Iterations(500)->UseManualTime()->Unit(benchmark::kMicrosecond);   \
  BENCHMARK(bm)->Arg(256 << 20)->Iterations(20)->UseManualTime()->Unit(benchmark::kMicrosecond);  \
  BENCHMARK(bm)->Arg(1 << 30)->Iterations(10)->UseManualTime()->Unit(benchmark::kMicrosecond)

LAZYPIN_SIZES(BM_Hit);
LAZYPIN_SIZES(BM_Defer);
BENCHMARK(BM_Miss)->Arg(64 << 10)->Arg(4 << 20)->Iterations(512)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ForkPooled)->Arg(64 << 20)->Arg(1 << 30)->Iterations(5)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace
