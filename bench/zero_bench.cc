// zero_bench: zeroing a block lazypin serves (a parked block, a kept host
// block) on the calling thread (memset) against ZeroInParallel with 2 to 16
// threads, at the sizes a reuse cycle serves. The block's pages are present,
// as a pinned block's are.
//   build/bench/zero_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <cstring>

#include "prefault.h"
#include "zero_fill.h"

namespace lazypin {
namespace {

void BM_Zero(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0)) << 20;
  const int threads = static_cast<int>(state.range(1));
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    state.SkipWithError("mmap failed");
    return;
  }
  memset(p, 1, bytes);  // every page present
  for (auto _ : state) {
    if (threads == 0) {
      memset(p, 0, bytes);
    } else if (threads == 1) {
      ZeroNonTemporal(p, bytes);
    } else {
      ZeroInParallel(p, bytes, threads);
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
  munmap(p, bytes);
}
// threads 0: memset; 1: the calling thread with non-temporal stores.
BENCHMARK(BM_Zero)
    ->ArgsProduct({{4, 16, 64, 256}, {0, 1, 2, 4, 8, 16}})
    ->ArgNames({"MiB", "threads"})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace lazypin
