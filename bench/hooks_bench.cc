// The price of lazypin's allocator hooks on their fast paths: free() and,
// since freed blocks come back (LAZYPIN_REUSE_FREED), the malloc family.
//
// This binary does not link lazypin: it measures free(malloc(64)) (and a
// page-sized block, calloc, posix_memalign, 4 MiB) in whatever process it
// runs in. Run it three ways and compare (from the build directory):
//
//   ./bench/hooks_bench
//   LD_PRELOAD=$PWD/shim/liblazypin.so LAZYPIN_MODE=log   ./bench/hooks_bench
//   LD_PRELOAD=$PWD/shim/liblazypin.so LAZYPIN_MODE=defer ./bench/hooks_bench
//
// (add --benchmark_repetitions=5 --benchmark_min_time=0.5 for stable numbers).
// Without CUDA calls nothing is ever pooled or parked, so the preloaded runs
// measure the fast paths: free's one relaxed load of the pool pointer (null in
// log mode) and, in defer mode, one of its entry count; each allocation hook's
// one relaxed load of the parked-block count, then a tail call through the
// real function (objdump -d liblazypin.so: <malloc> is load, test, load, test,
// then the thread's own-thread byte, %fs-relative, compared (lazypin's own
// threads pass the fork fence), jmp *%rax).
#include <benchmark/benchmark.h>

#include <cstdlib>

namespace {

void BM_FreeMalloc64(benchmark::State& state) {
  for (auto _ : state) {
    void* p = std::malloc(64);
    benchmark::DoNotOptimize(p);
    std::free(p);
  }
}
BENCHMARK(BM_FreeMalloc64);

void BM_FreeMalloc4K(benchmark::State& state) {
  for (auto _ : state) {
    void* p = std::malloc(4096);
    benchmark::DoNotOptimize(p);
    std::free(p);
  }
}
BENCHMARK(BM_FreeMalloc4K);

void BM_ReallocGrow(benchmark::State& state) {
  for (auto _ : state) {
    void* p = std::malloc(64);
    benchmark::DoNotOptimize(p);
    p = std::realloc(p, 128);
    benchmark::DoNotOptimize(p);
    std::free(p);
  }
}
BENCHMARK(BM_ReallocGrow);

void BM_Calloc64(benchmark::State& state) {
  for (auto _ : state) {
    void* p = std::calloc(1, 64);
    benchmark::DoNotOptimize(p);
    std::free(p);
  }
}
BENCHMARK(BM_Calloc64);

void BM_PosixMemalign64(benchmark::State& state) {
  for (auto _ : state) {
    void* p = nullptr;
    benchmark::DoNotOptimize(posix_memalign(&p, 64, 256));
    std::free(p);
  }
}
BENCHMARK(BM_PosixMemalign64);

// A block that glibc takes from its heap once its mmap threshold has moved
// up (the first free of a 4 MiB mmapped chunk raises it).
void BM_FreeMalloc4M(benchmark::State& state) {
  for (auto _ : state) {
    void* p = std::malloc(4 << 20);
    benchmark::DoNotOptimize(p);
    std::free(p);
  }
}
BENCHMARK(BM_FreeMalloc4M);

}  // namespace
