// callsite_bench: what a native stack costs per record (LAZYPIN_STACKS=1
// takes one on every driver call): CallSites::Capture of a stack already
// interned, `depth` frames below the benchmark's own, against glibc's
// backtrace() for the same stack; and what an NVTX range with its marker
// costs per call when no tool is attached (nvtx.h).
//   build/bench/callsite_bench
#include <execinfo.h>

#include <string_view>

#include "benchmark/benchmark.h"
#include "callsite.h"
#include "nvtx.h"

namespace {

template <typename Fn>
__attribute__((noinline)) int Deep(int depth, Fn& fn) {
  if (depth == 0) return fn();
  const int r = Deep(depth - 1, fn);
  benchmark::DoNotOptimize(r);
  return r;
}

// Emits nothing (the log's writer formats a new stack's line, not the caller).
void Ignore(std::string&&) {}
void IgnoreId(int) {}
const lazypin::CallSites::Emit kIgnore{Ignore, IgnoreId};

void BM_CaptureInterned(benchmark::State& state) {
  lazypin::CallSites sites(nullptr);
  auto capture = [&] { return sites.Capture(kIgnore); };
  for (auto _ : state) benchmark::DoNotOptimize(Deep(static_cast<int>(state.range(0)), capture));
}
BENCHMARK(BM_CaptureInterned)->Arg(0)->Arg(4)->Arg(8)->Arg(16);

// LAZYPIN_STACKS=1's common case: a call shape already seen (no unwinding).
void BM_CaptureOnceSeenShape(benchmark::State& state) {
  lazypin::CallSites sites(nullptr);
  sites.CaptureOnce(7, kIgnore);
  for (auto _ : state) benchmark::DoNotOptimize(sites.CaptureOnce(7, kIgnore));
}
BENCHMARK(BM_CaptureOnceSeenShape);

void BM_GlibcBacktrace(benchmark::State& state) {
  auto capture = [] {
    void* frames[lazypin::CallSites::kMaxFrames];
    return backtrace(frames, lazypin::CallSites::kMaxFrames);
  };
  for (auto _ : state) benchmark::DoNotOptimize(Deep(static_cast<int>(state.range(0)), capture));
}
BENCHMARK(BM_GlibcBacktrace)->Arg(0)->Arg(4)->Arg(8)->Arg(16);

void BM_NvtxRangeAndMarkerNoTool(benchmark::State& state) {
  for (auto _ : state) {
    lazypin::nvtx::CallBegins(lazypin::Api::kCudaHostRegister);
    lazypin::nvtx::CallEnds(lazypin::Action::kHit, lazypin::PassReason::kNone);
  }
}
BENCHMARK(BM_NvtxRangeAndMarkerNoTool);

}  // namespace
