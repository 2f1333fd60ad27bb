// Micro-benchmarks of the kernel watch and the page classifier:
//  - BM_DrainNothingWatched: Drain when no range is watched (the fast path);
//  - BM_DrainNothingPending/N: Drain with N ranges watched and no event
//    (two uncontended locks and one non-blocking read(2) of the userfaultfd);
//  - BM_Watch: Watch alone; BM_WatchUnwatch: Watch + Unwatch of an isolated 64 KiB range inside a
//    larger mapping (each splits the VMA in 3, then merges it back);
//  - BM_WatchPopulated/<bytes>: Watch of a whole populated buffer; Unwatch's
//    time in the counter unwatch_us;
//  - BM_Classify/<method>/<extra mappings>: ClassifyRange of a 64 KiB anonymous
//    buffer mapped last (the worst case for parsing), with 0 or 5000 extra
//    mappings in the process.
#include <benchmark/benchmark.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "mem_watch.h"
#include "page_class.h"

namespace lazypin {
namespace {

const uintptr_t kPage = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));

std::unique_ptr<MemWatch> OpenOrSkip(benchmark::State& state) {
  std::string why;
  auto watch = MemWatch::Open(&why);
  if (!watch) state.SkipWithError(why.c_str());
  return watch;
}

char* MapAnon(size_t bytes) {
  return static_cast<char*>(
      mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
}

void BM_DrainNothingWatched(benchmark::State& state) {
  auto watch = OpenOrSkip(state);
  if (!watch) return;
  for (auto _ : state) watch->Drain([](uintptr_t, uintptr_t) {});
}
BENCHMARK(BM_DrainNothingWatched);

void BM_DrainNothingPending(benchmark::State& state) {
  auto watch = OpenOrSkip(state);
  if (!watch) return;
  const size_t n = static_cast<size_t>(state.range(0));
  char* area = MapAnon(n * 2 * kPage);
  for (size_t i = 0; i < n; ++i) {
    const uintptr_t lo = reinterpret_cast<uintptr_t>(area) + 2 * i * kPage;
    watch->Watch(lo, lo + kPage);
  }
  for (auto _ : state) watch->Drain([](uintptr_t, uintptr_t) {});
  for (size_t i = 0; i < n; ++i) {
    const uintptr_t lo = reinterpret_cast<uintptr_t>(area) + 2 * i * kPage;
    watch->Unwatch(lo, lo + kPage);
  }
  munmap(area, n * 2 * kPage);
}
BENCHMARK(BM_DrainNothingPending)->Arg(1)->Arg(1000);

void BM_WatchUnwatch(benchmark::State& state) {
  auto watch = OpenOrSkip(state);
  if (!watch) return;
  char* area = MapAnon(1 << 20);
  const uintptr_t lo = reinterpret_cast<uintptr_t>(area) + (256 << 10);
  for (auto _ : state) {
    if (!watch->Watch(lo, lo + (64 << 10))) state.SkipWithError("Watch refused");
    watch->Unwatch(lo, lo + (64 << 10));
  }
  munmap(area, 1 << 20);
}
BENCHMARK(BM_WatchUnwatch);

// Watch alone (what a real register adds), Unwatch outside the timing.
void BM_Watch(benchmark::State& state) {
  auto watch = OpenOrSkip(state);
  if (!watch) return;
  char* area = MapAnon(1 << 20);
  const uintptr_t lo = reinterpret_cast<uintptr_t>(area) + (256 << 10);
  for (auto _ : state) {
    if (!watch->Watch(lo, lo + (64 << 10))) state.SkipWithError("Watch refused");
    state.PauseTiming();
    watch->Unwatch(lo, lo + (64 << 10));
    state.ResumeTiming();
  }
  munmap(area, 1 << 20);
}
BENCHMARK(BM_Watch);

// Watch and Unwatch of a whole populated buffer of <bytes> (what a first
// register adds, and what the release of its registration pays), timed apart.
void BM_WatchPopulated(benchmark::State& state) {
  auto watch = OpenOrSkip(state);
  if (!watch) return;
  const size_t bytes = static_cast<size_t>(state.range(0));
  char* area = MapAnon(bytes);
  for (size_t off = 0; off < bytes; off += kPage) area[off] = 1;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(area);
  double unwatch_s = 0;
  for (auto _ : state) {
    if (!watch->Watch(lo, lo + bytes)) state.SkipWithError("Watch refused");
    state.PauseTiming();
    const auto t0 = std::chrono::steady_clock::now();
    watch->Unwatch(lo, lo + bytes);
    unwatch_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.ResumeTiming();
  }
  state.counters["unwatch_us"] = unwatch_s * 1e6 / static_cast<double>(state.iterations());
  munmap(area, bytes);
}
BENCHMARK(BM_WatchPopulated)->Arg(64 << 10)->Arg(4 << 20)->Arg(1 << 30)->Iterations(20)->Unit(benchmark::kMicrosecond);

void BM_Classify(benchmark::State& state) {
  const auto method = static_cast<MapsMethod>(state.range(0));
  if (method == MapsMethod::kProcmapQuery && !HaveProcmapQuery()) {
    state.SkipWithError("no PROCMAP_QUERY");
    return;
  }
  // Extra mappings: one region with every other page read-only (one VMA each).
  const size_t extra = static_cast<size_t>(state.range(1));
  char* many = extra ? MapAnon(2 * extra * kPage) : nullptr;
  for (size_t i = 0; i < extra; ++i) mprotect(many + 2 * i * kPage, kPage, PROT_READ);
  char* buf = MapAnon(64 << 10);
  const uintptr_t lo = reinterpret_cast<uintptr_t>(buf);
  for (auto _ : state) {
    const PageClass c = ClassifyRange(lo, lo + (64 << 10), method);
    if (c != PageClass::kPrivateAnonymous) state.SkipWithError(PageClassName(c));
    benchmark::DoNotOptimize(c);
  }
  munmap(buf, 64 << 10);
  if (many) munmap(many, 2 * extra * kPage);
}
BENCHMARK(BM_Classify)
    ->ArgNames({"method", "extra_maps"})
    ->Args({static_cast<int>(MapsMethod::kProcmapQuery), 0})
    ->Args({static_cast<int>(MapsMethod::kProcmapQuery), 5000})
    ->Args({static_cast<int>(MapsMethod::kParse), 0})
    ->Args({static_cast<int>(MapsMethod::kParse), 5000});

}  // namespace
}  // namespace lazypin
