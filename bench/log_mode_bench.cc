// log_mode_bench: what lazypin's log mode adds to one program call (issue
// 16: goal < 0.5 us). Program calls through the runtime, as a program makes
// them; run it once plain and once under LD_PRELOAD=liblazypin.so with
// LAZYPIN_MODE=log (bench/log_mode.py does both, interleaved, and prints the
// per-call difference). On the simulated stack use SIMCUDA_SLEEP=0
// SIMCUDA_PIN=0 so that the simulated driver's own time is small and steady.
//  - BM_RegisterUnregister: cudaHostRegister + cudaHostUnregister of one
//    4 KiB buffer (two program calls per iteration; counters: ns per call).
//  - BM_UnregisterNotRegistered: cudaHostUnregister of memory never
//    registered (the driver refuses at once: almost all of it is lazypin's).
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>
#include <stdlib.h>

namespace {

void* Page() {
  static void* buf = [] {
    void* p = nullptr;
    if (posix_memalign(&p, 4096, 4096) != 0) abort();
    if (cudaFree(nullptr) != cudaSuccess) abort();  // the context, outside the timing
    return p;
  }();
  return buf;
}

void BM_RegisterUnregister(benchmark::State& state) {
  void* buf = Page();
  for (auto _ : state) {
    if (cudaHostRegister(buf, 4096, cudaHostRegisterDefault) != cudaSuccess) abort();
    if (cudaHostUnregister(buf) != cudaSuccess) abort();
  }
  state.counters["ns_per_call"] =
      benchmark::Counter(2.0 * state.iterations(), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_RegisterUnregister)->MinTime(0.5)->UseRealTime();

void BM_UnregisterNotRegistered(benchmark::State& state) {
  void* buf = Page();
  for (auto _ : state) {
    benchmark::DoNotOptimize(cudaHostUnregister(buf));
  }
  cudaGetLastError();
  state.counters["ns_per_call"] =
      benchmark::Counter(state.iterations(), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_UnregisterNotRegistered)->MinTime(0.5)->UseRealTime();

}  // namespace
