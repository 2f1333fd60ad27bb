// The host-allocation cache (shim/core/host_alloc_cache.h) on a fake driver that
// models cuMemHostAlloc / cuMemFreeHost: which blocks the driver has, what a
// program's calls return, what the cache frees on its own and why.
#include "host_alloc_cache.h"

#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "test_limits.h"

namespace lazypin {
namespace {

const Context kCtx = reinterpret_cast<Context>(0x11);
const Context kOther = reinterpret_cast<Context>(0x22);
constexpr int kInvalidValue = 1;

// The driver's host allocations: real memory (so zeroing can be checked).
class FakeDriver final : public HostAllocDriver, public HostAllocObserver {
 public:
  ~FakeDriver() override {
    for (auto& [p, b] : blocks) free(reinterpret_cast<void*>(p));
  }
  // The program's own calls.
  int Alloc(void** out, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu);
    if (oom_next) {
      oom_next = false;
      return kCudaOutOfMemory;
    }
    void* p = aligned_alloc(4096, HostAllocCache::Span(bytes));
    memset(p, 0, HostAllocCache::Span(bytes));
    blocks[reinterpret_cast<uintptr_t>(p)] = bytes;
    allocs += 1;
    *out = p;
    return kCudaSuccess;
  }
  int ProgramFree(uintptr_t p) {
    std::lock_guard<std::mutex> lock(mu);
    return FreeLocked(p);
  }
  // HostAllocDriver: lazypin's frees.
  int Free(uintptr_t p, Context ctx, ReleaseWait* wait) override {
    std::lock_guard<std::mutex> lock(mu);
    wait->waited_ns = 5;
    own_frees += 1;
    return FreeLocked(p);
  }
  // What every block reports (cuMemHostGetFlags); -1: nothing.
  bool Flags(uintptr_t, unsigned* flags) override {
    if (reported < 0) return false;
    *flags = static_cast<unsigned>(reported);
    return true;
  }
  int64_t NowNs() override { return now.load(); }
  void OnHostRelease(uintptr_t ptr, size_t bytes, EvictReason reason, int result,
                     int64_t latency_ns, const ReleaseWait& wait) override {
    std::lock_guard<std::mutex> lock(mu);
    releases.push_back({ptr, reason, result});
  }
  bool Has(void* p) {
    std::lock_guard<std::mutex> lock(mu);
    return blocks.count(reinterpret_cast<uintptr_t>(p)) != 0;
  }

  struct Release {
    uintptr_t ptr;
    EvictReason reason;
    int result;
  };
  std::mutex mu;
  std::map<uintptr_t, size_t> blocks;
  std::vector<Release> releases;
  int allocs = 0, own_frees = 0;
  bool oom_next = false;
  int reported = -1;
  std::atomic<int64_t> now{0};

 private:
  int FreeLocked(uintptr_t p) {
    auto it = blocks.find(p);
    if (it == blocks.end()) return kInvalidValue;
    free(reinterpret_cast<void*>(p));
    blocks.erase(it);
    return kCudaSuccess;
  }
};

class HostAllocCacheTest : public ::testing::Test {
 protected:
  explicit HostAllocCacheTest(HostAllocLimits limits = DefaultHostAllocLimits()) : cache_(&driver_, &driver_, limits) {}

  Outcome Alloc(void** out, size_t bytes, unsigned flags = 0, Context ctx = kCtx) {
    HostAllocRequest request{bytes, flags, ctx, 0};
    return cache_.Alloc(request, out, [&] { return driver_.Alloc(out, bytes); });
  }
  Outcome Free(void* p, bool may_keep = true) {
    const uintptr_t ptr = reinterpret_cast<uintptr_t>(p);
    return cache_.Free(ptr, [&] { return driver_.ProgramFree(ptr); }, [&] { return may_keep; });
  }

  FakeDriver driver_;
  HostAllocCache cache_;
};

TEST_F(HostAllocCacheTest, FreeThenSameAllocationIsAHitAndZeroed) {
  void* p = nullptr;
  EXPECT_EQ(Alloc(&p, 10000).action, Action::kMiss);
  memset(p, 0xab, 10000);
  const Outcome freed = Free(p);
  EXPECT_EQ(freed.result, kCudaSuccess);
  EXPECT_EQ(freed.action, Action::kDeferred);
  EXPECT_TRUE(driver_.Has(p));  // kept: the driver still has it
  void* q = nullptr;
  const Outcome hit = Alloc(&q, 10000);
  EXPECT_EQ(hit.action, Action::kHit);
  EXPECT_EQ(q, p);
  EXPECT_EQ(driver_.allocs, 1);
  // A fresh block reads as zeros (the bytes asked for: the rest of its last
  // page may be another block's).
  const unsigned char* bytes = static_cast<const unsigned char*>(q);
  for (size_t i = 0; i < 10000; ++i) ASSERT_EQ(bytes[i], 0) << i;
  const HostAllocCounters c = cache_.Counters();
  EXPECT_EQ(c.hits, 1u);
  EXPECT_EQ(c.misses, 1u);
  EXPECT_EQ(c.kept, 1u);
  EXPECT_EQ(c.zeroed_bytes, 10000u);
  EXPECT_EQ(c.cached_entries, 0u);
}

TEST_F(HostAllocCacheTest, OnlyAnExactMatchIsServed) {
  void* p = nullptr;
  Alloc(&p, 8192, 1);
  Free(p);
  void* q = nullptr;
  EXPECT_EQ(Alloc(&q, 8191, 1).action, Action::kMiss);  // same pages, other size
  EXPECT_EQ(Alloc(&q, 8192, 1, kOther).action, Action::kMiss);  // other context
  EXPECT_EQ(Alloc(&q, 8192, 1).action, Action::kHit);
  EXPECT_EQ(q, p);
  Free(q);
  EXPECT_EQ(Alloc(&q, 8192, 0).action, Action::kMiss);  // other flags
}

// The driver packs small blocks into larger allocations whose flags they
// report. A new block that reports other flags than a block of its own
// allocation would (those asked for, with DEVICEMAP) while blocks are kept
// under other flags in its context: it is freed, those blocks are released
// (as the program's frees would have made them go) and it is made again.
TEST_F(HostAllocCacheTest, APackedAllocationReleasesBlocksKeptWithOtherFlagsAndIsMadeAgain) {
  void *a = nullptr, *b = nullptr, *c = nullptr, *q = nullptr;
  Alloc(&a, 4096, 2);
  Alloc(&b, 4096, 3);
  Alloc(&c, 4096, 2, kOther);
  Free(a);
  Free(b);
  Free(c);
  driver_.reported = 2;  // packed with a's allocation
  const int allocs = driver_.allocs;
  const Outcome miss = Alloc(&q, 65536, 3);
  EXPECT_EQ(miss.result, kCudaSuccess);
  EXPECT_EQ(miss.action, Action::kMiss);
  EXPECT_EQ(miss.evicted, 1);  // a: flags 2 in this context
  EXPECT_EQ(driver_.allocs, allocs + 2);  // made again
  EXPECT_TRUE(driver_.Has(q));
  EXPECT_FALSE(driver_.Has(a));
  EXPECT_TRUE(driver_.Has(b));  // the same flags: kept
  EXPECT_TRUE(driver_.Has(c));  // another context: kept
  std::vector<EvictReason> reasons;
  for (const auto& r : driver_.releases) reasons.push_back(r.reason);
  EXPECT_EQ(reasons, std::vector<EvictReason>{EvictReason::kFlags});
  EXPECT_STREQ(EvictReasonName(EvictReason::kFlags), "flags");
  EXPECT_EQ(Free(q).action, Action::kDeferred);
  EXPECT_EQ(Alloc(&q, 4096, 3).action, Action::kHit);  // a hit asks nothing
  EXPECT_EQ(q, b);
}

TEST_F(HostAllocCacheTest, ABlockReportingItsOwnFlagsReleasesNothing) {
  void *a = nullptr, *q = nullptr;
  Alloc(&a, 4096, 2);
  Free(a);
  driver_.reported = 3;  // what a block of its own allocation reports
  const int allocs = driver_.allocs;
  const Outcome miss = Alloc(&q, 65536, 1);  // PORTABLE: 1 | DEVICEMAP
  EXPECT_EQ(miss.evicted, 0);
  EXPECT_EQ(driver_.allocs, allocs + 1);
  EXPECT_TRUE(driver_.Has(a));
  EXPECT_TRUE(driver_.releases.empty());
}

TEST_F(HostAllocCacheTest, DoubleFreeOfACachedBlockGetsTheDriversAnswer) {
  void* p = nullptr;
  Alloc(&p, 4096);
  EXPECT_EQ(Free(p).action, Action::kDeferred);
  const Outcome second = Free(p);
  EXPECT_EQ(second.result, kInvalidValue);  // as the driver answers a freed pointer
  EXPECT_EQ(second.action, Action::kForward);
  EXPECT_EQ(second.evicted, 1);
  EXPECT_FALSE(driver_.Has(p));
  ASSERT_EQ(driver_.releases.size(), 1u);
  EXPECT_EQ(driver_.releases[0].reason, EvictReason::kDoubleFree);
  EXPECT_EQ(cache_.Counters().releases[static_cast<int>(EvictReason::kDoubleFree)], 1u);
  EXPECT_FALSE(cache_.MaybeHolds());
}

TEST_F(HostAllocCacheTest, UnknownPointerIsForwarded) {
  int local;
  const Outcome o = Free(&local);
  EXPECT_EQ(o.result, kInvalidValue);
  EXPECT_EQ(o.action, Action::kForward);
}

TEST_F(HostAllocCacheTest, QueryInsideACachedBlockFreesItFirst) {
  void* p = nullptr;
  Alloc(&p, 3 * 4096 + 10);
  Free(p);
  EXPECT_TRUE(cache_.MaybeHolds());
  const uintptr_t base = reinterpret_cast<uintptr_t>(p);
  EXPECT_EQ(cache_.Invalidate(base - 4096, base, EvictReason::kQuery), 0);  // just before it
  // The last page, past the bytes asked for: still the driver's block.
  EXPECT_EQ(cache_.Invalidate(base + 3 * 4096 + 100, base + 3 * 4096 + 101, EvictReason::kQuery), 1);
  EXPECT_FALSE(driver_.Has(p));
  EXPECT_FALSE(cache_.MaybeHolds());
  void* q = nullptr;
  EXPECT_EQ(Alloc(&q, 3 * 4096 + 10).action, Action::kMiss);
}

TEST_F(HostAllocCacheTest, NotKeptWhenTheWaitSaysNo) {
  void* p = nullptr;
  Alloc(&p, 4096);
  const Outcome o = Free(p, /*may_keep=*/false);
  EXPECT_EQ(o.action, Action::kForward);
  EXPECT_EQ(o.result, kCudaSuccess);
  EXPECT_FALSE(driver_.Has(p));
  EXPECT_EQ(Free(p).result, kInvalidValue);  // and the program's double free is the driver's
}

TEST_F(HostAllocCacheTest, IdleBlocksAreReleased) {
  void* p = nullptr;
  void* q = nullptr;
  Alloc(&p, 4096);
  Alloc(&q, 8192);
  Free(p);
  driver_.now = 1000;
  Free(q);
  driver_.now = 1500;
  EXPECT_EQ(cache_.CollectIdle(1000), 1);  // p: freed at 0
  EXPECT_FALSE(driver_.Has(p));
  EXPECT_TRUE(driver_.Has(q));
  driver_.now = 2000;
  EXPECT_EQ(cache_.CollectIdle(1000), 1);
  EXPECT_FALSE(driver_.Has(q));
  EXPECT_EQ(cache_.Counters().releases[static_cast<int>(EvictReason::kIdle)], 2u);
}

TEST_F(HostAllocCacheTest, ContextTeardownForgetsWithoutFreeing) {
  void* p = nullptr;
  void* live = nullptr;
  Alloc(&p, 4096);
  Alloc(&live, 4096, 0, kOther);
  Free(p);
  EXPECT_EQ(cache_.ForgetContext(kCtx), 1);
  EXPECT_EQ(driver_.own_frees, 0);  // the driver frees the context's blocks itself
  EXPECT_FALSE(cache_.MaybeHolds());
  void* q = nullptr;
  EXPECT_EQ(Alloc(&q, 4096).action, Action::kMiss);
  EXPECT_EQ(cache_.ForgetDevice(0), 2);  // both live blocks of device 0 now
  // A free of a forgotten live block is the driver's.
  EXPECT_EQ(Free(live).action, Action::kForward);
}

TEST_F(HostAllocCacheTest, OutOfMemoryReleasesTheCacheAndRetries) {
  void* p = nullptr;
  Alloc(&p, 4096);
  Free(p);
  driver_.oom_next = true;
  void* q = nullptr;
  const Outcome o = Alloc(&q, 1 << 20);
  EXPECT_EQ(o.result, kCudaSuccess);
  EXPECT_EQ(o.action, Action::kMiss);
  EXPECT_EQ(o.evicted, 1);
  EXPECT_FALSE(driver_.Has(p));
}

TEST_F(HostAllocCacheTest, ReleaseAllFreesEverythingCached) {
  std::vector<void*> blocks(5);
  for (void*& b : blocks) Alloc(&b, 4096);
  for (void* b : blocks) Free(b);
  EXPECT_EQ(cache_.ReleaseAll(EvictReason::kFork), 5);
  for (void* b : blocks) EXPECT_FALSE(driver_.Has(b));
  EXPECT_EQ(cache_.Counters().cached_bytes, 0u);
}

TEST_F(HostAllocCacheTest, AbandonedAfterForkNeverServesNorFrees) {
  void* p = nullptr;
  Alloc(&p, 4096);
  Free(p);
  cache_.AbandonAfterFork();
  void* q = nullptr;
  EXPECT_EQ(Alloc(&q, 4096).action, Action::kMiss);
  EXPECT_NE(q, p);
  EXPECT_EQ(cache_.ReleaseAll(EvictReason::kExit), 0);
  EXPECT_EQ(driver_.own_frees, 0);
}

class BoundedCacheTest : public HostAllocCacheTest {
 protected:
  BoundedCacheTest() : HostAllocCacheTest(HostAllocLimits{3 * 4096, 2, true}) {}
};

TEST_F(BoundedCacheTest, OldestGoFirstAndTooBigIsForwarded) {
  void* a = nullptr;
  void* b = nullptr;
  void* c = nullptr;
  void* big = nullptr;
  Alloc(&a, 4096);
  Alloc(&b, 4096);
  Alloc(&c, 4096);
  Alloc(&big, 4 * 4096);
  Free(a);
  Free(b);
  Free(c);  // three entries over the bound of two: a goes
  EXPECT_FALSE(driver_.Has(a));
  EXPECT_TRUE(driver_.Has(b));
  EXPECT_TRUE(driver_.Has(c));
  EXPECT_EQ(Free(big).action, Action::kForward);  // alone over the byte bound
  EXPECT_FALSE(driver_.Has(big));
  const HostAllocCounters counters = cache_.Counters();
  EXPECT_EQ(counters.releases[static_cast<int>(EvictReason::kLru)], 1u);
  EXPECT_EQ(counters.cached_entries, 2u);
  EXPECT_EQ(counters.peak_entries, 2u);
  EXPECT_LE(counters.peak_bytes, 3u * 4096);
}

// Threads allocating and freeing the same sizes while another queries and
// collects: every block the program holds is the driver's and distinct, and
// nothing is freed twice (the fake driver would answer 1).
TEST_F(HostAllocCacheTest, ConcurrentCyclesStayConsistent) {
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::thread collector([&] {
    while (!stop) {
      cache_.CollectIdle(0);
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        void* p = nullptr;
        const size_t bytes = 4096 * (1 + (i + t) % 3);
        if (Alloc(&p, bytes).result != kCudaSuccess || !driver_.Has(p)) bad++;
        static_cast<volatile char*>(p)[0] = 1;
        if (Free(p).result != kCudaSuccess) bad++;
      }
    });
  }
  for (auto& th : threads) th.join();
  stop = true;
  collector.join();
  EXPECT_EQ(bad.load(), 0);
  for (const auto& r : driver_.releases) EXPECT_EQ(r.result, kCudaSuccess);
}

}  // namespace
}  // namespace lazypin

#include "stats.h"

namespace lazypin {
namespace {

TEST(HostAllocStatsTest, HostCallsStayOutOfThePoolsFiguresAndShowInTheSummary) {
  Stats stats;
  stats.RecordCall(Api::kCudaHostAlloc, 4096, 0, 1000, Action::kHit);
  stats.RecordCall(Api::kCuMemFreeHost, 0, 0, 500, Action::kDeferred);
  HostAllocCounters host;
  host.hits = 1;
  host.kept = 1;
  host.releases[static_cast<int>(EvictReason::kIdle)] = 2;
  const std::string json = stats.SummaryJson(PoolCounters{}, 1, "exit", &host);
  EXPECT_NE(json.find(R"("cudaHostAlloc":{"calls":1)"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("pool":{"hits":0,"misses":0,"deferred":0,)"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("size_classes":{})"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("host_alloc":{"hits":1,"misses":0,"kept":1,"forwarded_frees":0,)"
                      R"("releases":{"idle":2})"),
            std::string::npos)
      << json;
  EXPECT_EQ(stats.SummaryJson(PoolCounters{}, 1, "exit").find("host_alloc"), std::string::npos);
  EXPECT_NE(stats.SummaryText(PoolCounters{}, true, &host).find("host allocs: 1 hits / 1"),
            std::string::npos);
  EXPECT_TRUE(IsHostAlloc(Api::kCuMemAllocHostV2));
  EXPECT_TRUE(IsHostFree(Api::kCudaFreeHost));
  EXPECT_FALSE(IsRegister(Api::kCudaHostAlloc));
  EXPECT_STREQ(ApiName(Api::kCuMemAllocHost), "cuMemAllocHost");
  EXPECT_STREQ(EvictReasonName(EvictReason::kDoubleFree), "double_free");
}

}  // namespace
}  // namespace lazypin
