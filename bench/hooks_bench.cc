// The price of lazypin's free() hook on the allocator fast path.
//
// This binary does not link lazypin: it measures free(malloc(64)) (and a
// page-sized block) in whatever process it runs in. Run it three ways and
// compare (from the build directory):
//
//   ./bench/hooks_bench
//   LD_PRELOAD=$PWD/shim/liblazypin.so LAZYPIN_MODE=log   ./bench/hooks_bench
//   LD_PRELOAD=$PWD/shim/liblazypin.so LAZYPIN_MODE=defer ./bench/hooks_bench
//
// (add --benchmark_repetitions=5 --benchmark_min_time=0.5 for stable numbers).
// Without CUDA calls nothing is ever pooled, so the preloaded runs measure the
// empty-pool fast path: one relaxed load of the pool pointer (null in log mode)
// and, in defer mode, one of its entry count.
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

}  // namespace
