// Micro-benchmarks of the pool's fast paths (shim/core/pool.h), against a driver
// that returns at once, so they measure lazypin's own cost:
//  - BM_HitCycle/N: a register served from the pool plus the unregister that
//    defers it again, with N other entries pooled;
//  - BM_MaybeHolds/N: the lock-free check every memory hook makes, for a range
//    that no pooled entry overlaps;
//  - BM_InvalidateMiss/N: Invalidate of a range that holds nothing (the
//    locked path a hook takes when the filter says "maybe");
//  - BM_ServeMiss: what every allocation pays while some block is parked
//    (LAZYPIN_REUSE_FREED) and none fits it: MemoryGuard::Serve's size
//    arithmetic and lock-free filter;
//  - BM_ParkServeHitCycle: the whole reuse cycle's lazypin side: a free that
//    parks, an allocation served, the register's hit and the deferral;
//  - BM_Zero/N/K: zeroing N MiB with memset (K=0) or the non-temporal stores
//    that zero parked blocks ahead of their reuse (K=1);
//  - BM_WriterBesideZeroing/K: a thread writing 64 MiB over and over at full
//    speed (memory-bound), alone (K=0) or while another thread zeroes as the
//    collector does (K=1: Collector::kZeroStepBytes steps, each followed by a
//    pause kZeroPauseFactor times its length): the ratio of the two rates is
//    what the zeroing costs a memory-bound program.
#include <benchmark/benchmark.h>
#include <sys/mman.h>
#include <time.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "collector.h"
#include "memory_guard.h"
#include "pool.h"
#include "sys.h"
#include "zero_fill.h"

namespace lazypin {
namespace {

class InstantDriver final : public PoolDriver {
 public:
  int Unregister(uintptr_t, Context, ReleaseWait*) override { return 0; }
  bool ReadFrames(uintptr_t, size_t, std::vector<uint64_t>*) override { return false; }
  int64_t NowNs() override { return ++now_; }

 private:
  int64_t now_ = 0;
};

constexpr uintptr_t kBase = uintptr_t{1} << 40;
constexpr size_t kBytes = 64 << 10;
const Context kCtx = reinterpret_cast<Context>(0x1);

// A pool with `n` deferred 64 KiB entries spread 1 MiB apart.
std::unique_ptr<Pool> MakePool(InstantDriver* driver, int64_t n) {
  PoolLimits limits;
  limits.max_entries = 1 << 20;
  limits.max_bytes = uint64_t{1} << 50;
  auto pool = std::make_unique<Pool>(driver, nullptr, limits);
  for (int64_t i = 0; i < n; ++i) {
    RegisterRequest req{kBase + static_cast<uintptr_t>(i) * (1 << 20), kBytes, 0, kCtx, 0};
    pool->Register(req, [] { return 0; });
    pool->Unregister(req.ptr, [] { return 0; });
  }
  return pool;
}

void BM_HitCycle(benchmark::State& state) {
  InstantDriver driver;
  auto pool = MakePool(&driver, state.range(0));
  const RegisterRequest req{kBase - (uintptr_t{1} << 30), kBytes, 0, kCtx, 0};
  pool->Register(req, [] { return 0; });
  pool->Unregister(req.ptr, [] { return 0; });
  for (auto _ : state) {
    const Outcome hit = pool->Register(req, [] { return 0; });
    const Outcome deferred = pool->Unregister(req.ptr, [] { return 0; });
    benchmark::DoNotOptimize(hit);
    benchmark::DoNotOptimize(deferred);
  }
  if (pool->Counters().hits != static_cast<uint64_t>(state.iterations())) {
    state.SkipWithError("the cycle did not hit");
  }
}
BENCHMARK(BM_HitCycle)->Arg(0)->Arg(1000)->Arg(10000);

void BM_MaybeHolds(benchmark::State& state) {
  InstantDriver driver;
  auto pool = MakePool(&driver, state.range(0));
  const uintptr_t lo = uintptr_t{1} << 45;  // far from every entry
  for (auto _ : state) {
    benchmark::DoNotOptimize(pool->MaybeHolds(lo, lo + 64));
  }
}
BENCHMARK(BM_MaybeHolds)->Arg(0)->Arg(10000);

void BM_InvalidateMiss(benchmark::State& state) {
  InstantDriver driver;
  auto pool = MakePool(&driver, state.range(0));
  // Between two pooled entries, in the same 2 MiB granule as one of them.
  const uintptr_t lo = kBase + (state.range(0) / 2) * (1 << 20) + kBytes + 4096;
  for (auto _ : state) {
    benchmark::DoNotOptimize(pool->Invalidate(lo, lo + 4096, EvictReason::kFree));
  }
}
BENCHMARK(BM_InvalidateMiss)->Arg(0)->Arg(10000);

void NoFree(void*) {}

void BM_ServeMiss(benchmark::State& state) {
  InstantDriver driver;
  auto pool = MakePool(&driver, 1);
  pool->EnableReuse(ReuseHooks{&NoFree, nullptr});
  if (!pool->Park(kBase, kBytes + 8)) state.SkipWithError("not parked");
  MemoryGuard guard(pool.get(), nullptr, nullptr, nullptr, /*reuse=*/true);
  size_t n = 64;
  for (auto _ : state) {
    benchmark::DoNotOptimize(guard.Serve(n, 0));
    n = n == 64 ? 4096 : 64;
  }
}
BENCHMARK(BM_ServeMiss);

void BM_ParkServeHitCycle(benchmark::State& state) {
  InstantDriver driver;
  auto pool = MakePool(&driver, 1);
  pool->EnableReuse(ReuseHooks{&NoFree, nullptr});
  MemoryGuard guard(pool.get(), nullptr, nullptr, nullptr, /*reuse=*/true);
  const size_t usable = GlibcFreshUsable(kBytes, 0, 4096).usable[0];
  RegisterRequest req{kBase, kBytes, 0, kCtx, 0};
  for (auto _ : state) {
    pool->Park(kBase, usable);
    benchmark::DoNotOptimize(guard.Serve(kBytes, 0));
    pool->Register(req, [] { return 0; });
    pool->Unregister(req.ptr, [] { return 0; });
  }
}
BENCHMARK(BM_ParkServeHitCycle);

// An anonymous mapping of `bytes`, written once (its pages present).
unsigned char* Mapped(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  memset(p, 1, bytes);
  return static_cast<unsigned char*>(p);
}

void BM_Zero(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0)) << 20;
  unsigned char* p = Mapped(bytes);
  if (p == nullptr) return state.SkipWithError("mmap");
  for (auto _ : state) {
    if (state.range(1) == 0) {
      memset(p, 0, bytes);
    } else {
      ZeroNonTemporal(p, bytes);
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  munmap(p, bytes);
}
BENCHMARK(BM_Zero)->ArgsProduct({{4, 64, 128, 192, 256}, {0, 1}})->UseRealTime();

void BM_WriterBesideZeroing(benchmark::State& state) {
  constexpr size_t kBytes = size_t{64} << 20;
  unsigned char* mine = Mapped(kBytes);
  unsigned char* parked = Mapped(kBytes);
  if (mine == nullptr || parked == nullptr) return state.SkipWithError("mmap");
  std::atomic<bool> stop{false};
  std::thread zeroing;
  if (state.range(0) == 1) {
    zeroing = std::thread([&] {
      for (size_t at = 0; !stop.load(std::memory_order_relaxed); at = (at + Collector::kZeroStepBytes) % kBytes) {
        const int64_t t0 = MonotonicNs();
        ZeroNonTemporal(parked + at, Collector::kZeroStepBytes);
        const int64_t pause = (MonotonicNs() - t0) * Collector::kZeroPauseFactor;
        const timespec ts{0, static_cast<long>(pause)};
        nanosleep(&ts, nullptr);
      }
    });
  }
  unsigned char fill = 0;
  for (auto _ : state) {
    memset(mine, ++fill, kBytes);
    benchmark::ClobberMemory();
  }
  stop = true;
  if (zeroing.joinable()) zeroing.join();
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBytes));
  munmap(mine, kBytes);
  munmap(parked, kBytes);
}
BENCHMARK(BM_WriterBesideZeroing)->Arg(0)->Arg(1)->UseRealTime()->MinTime(1.0);

}  // namespace
}  // namespace lazypin
