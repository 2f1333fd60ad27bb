// The memory budget (shim/core/memory_budget.h) and the probe it reads
// (shim/os/memory_limit.h): the headroom read from cgroup and
// meminfo files (here: files the test writes), the keep rule, the announced
// allocations' slack, and the host-allocation cache keeping and yielding by it.
#include "memory_budget.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"
#include "host_alloc_cache.h"
#include "memory_limit.h"
#include "test_limits.h"

namespace lazypin {
namespace {

constexpr int64_t kM = int64_t{1} << 20;

// A cgroup's limit and usage files and a meminfo, rewritten in place (the
// probe reads them with pread at offset 0, as the kernel's files).
class Files {
 public:
  Files() {
    char dir[] = "/tmp/lazypin-budget-XXXXXX";
    dir_ = mkdtemp(dir);
    limit = dir_ + "/limit";
    usage = dir_ + "/usage";
    meminfo = dir_ + "/meminfo";
    Set(1000 * kM, 600 * kM, 100000 * kM);
  }
  ~Files() {
    unlink(limit.c_str());
    unlink(usage.c_str());
    unlink(meminfo.c_str());
    rmdir(dir_.c_str());
  }
  void Set(int64_t limit_bytes, int64_t usage_bytes, int64_t available_bytes) {
    Write(limit, limit_bytes < 0 ? "max\n" : std::to_string(limit_bytes) + "\n");
    Write(usage, std::to_string(usage_bytes) + "\n");
    Write(meminfo, "MemTotal:       99999999 kB\nMemFree:        1 kB\nMemAvailable:   " +
                       std::to_string(available_bytes / 1024) + " kB\nBuffers: 0 kB\n");
  }
  std::string limit, usage, meminfo;

 private:
  static void Write(const std::string& path, const std::string& text) {
    FILE* f = fopen(path.c_str(), "w");
    fputs(text.c_str(), f);
    fclose(f);
  }
  std::string dir_;
};

TEST(MemoryProbeTest, HeadroomIsTheCgroupsOrTheMachinesWhicheverIsLess) {
  Files files;
  MemoryProbe probe(files.limit.c_str(), files.usage.c_str(), files.meminfo.c_str());
  EXPECT_EQ(probe.Headroom(), 400 * kM);
  files.Set(1000 * kM, 600 * kM, 100 * kM);
  EXPECT_EQ(probe.Headroom(), 100 * kM);
  files.Set(-1, 600 * kM, 300 * kM);  // memory.max "max": no limit
  EXPECT_EQ(probe.Headroom(), 300 * kM);
  files.Set(1000 * kM, 1200 * kM, 300 * kM);  // over its limit (v1 usage is approximate)
  EXPECT_LT(probe.Headroom(), 0);
  MemoryProbe none("", "", "");
  EXPECT_EQ(none.Headroom(), INT64_MAX);
}

TEST(MemoryBudgetTest, KeepsOnlyWhileTheHeadroomIsAtLeastTheMargin) {
  Files files;
  MemoryProbe probe(files.limit.c_str(), files.usage.c_str(), files.meminfo.c_str());
  std::atomic<int64_t> gauge{0};
  MemoryBudget budget(&MemoryProbe::HeadroomOf, &probe, 100 * kM, &gauge);
  int woken = 0;
  budget.SetWaker([](void* n) { ++*static_cast<int*>(n); }, &woken);
  EXPECT_TRUE(budget.MayKeep());
  EXPECT_EQ(woken, 1);  // the collector starts polling
  EXPECT_TRUE(budget.TakeKeptSignal());
  EXPECT_FALSE(budget.TakeKeptSignal());
  files.Set(1000 * kM, 950 * kM, 100000 * kM);
  EXPECT_EQ(budget.ShortOf(budget.margin()), 50 * kM);
  EXPECT_TRUE(budget.Tight());
  EXPECT_FALSE(budget.MayKeep());
  files.Set(1000 * kM, 500 * kM, 100000 * kM);
  EXPECT_EQ(budget.ShortOf(budget.margin()), 0u);
  EXPECT_TRUE(budget.MayKeep());
}

TEST(MemoryBudgetTest, AnnouncedAllocationsCountDownTheSlackThenRead) {
  Files files;  // headroom 400M
  MemoryProbe probe(files.limit.c_str(), files.usage.c_str(), files.meminfo.c_str());
  std::atomic<int64_t> gauge{1};
  MemoryBudget budget(&MemoryProbe::HeadroomOf, &probe, 100 * kM, &gauge);
  EXPECT_EQ(budget.ShortOf(0), 0u);  // a reading: slack 300M
  EXPECT_EQ(budget.Announce(200 * kM), 0u);  // slack 100M, no reading
  // The files now say the 200M were used: the next announce that would take
  // the slack below zero reads them.
  files.Set(1000 * kM, 800 * kM, 100000 * kM);
  EXPECT_EQ(budget.Announce(50 * kM), 0u);  // slack 50M, not read
  EXPECT_EQ(budget.Announce(150 * kM), 250u * kM);  // read: 200M free, 150M + 100M needed
  files.Set(1000 * kM, 500 * kM, 100000 * kM);  // released
  EXPECT_EQ(budget.Announce(150 * kM), 0u);
}

// The host-allocation cache keeps by the budget and yields its oldest block.
class Driver final : public HostAllocDriver {
 public:
  int Free(uintptr_t p, Context, ReleaseWait*) override {
    free(reinterpret_cast<void*>(p));
    frees += 1;
    return kCudaSuccess;
  }
  bool Flags(uintptr_t, unsigned*) override { return false; }
  int64_t NowNs() override { return 0; }
  int frees = 0;
};

TEST(MemoryBudgetTest, TheHostCacheKeepsByTheBudgetAndYieldsOldestFirst) {
  Files files;
  MemoryProbe probe(files.limit.c_str(), files.usage.c_str(), files.meminfo.c_str());
  std::atomic<int64_t> gauge{0};
  MemoryBudget budget(&MemoryProbe::HeadroomOf, &probe, 100 * kM, &gauge);
  Driver driver;
  HostAllocLimits limits = DefaultHostAllocLimits();
  limits.budget = &budget;
  HostAllocCache cache(&driver, nullptr, limits);
  const Context ctx = reinterpret_cast<Context>(0x1);
  void* blocks[3] = {};
  for (void*& b : blocks) {
    cache.Alloc(HostAllocRequest{4096, 0, ctx, 0}, &b, [&] {
      b = aligned_alloc(4096, 4096);
      return kCudaSuccess;
    });
  }
  int forwarded = 0;
  auto forward = [&] {
    forwarded += 1;
    return kCudaSuccess;
  };
  EXPECT_EQ(cache.Free(reinterpret_cast<uintptr_t>(blocks[0]), forward, [] { return true; }).action,
            Action::kDeferred);
  EXPECT_EQ(cache.Free(reinterpret_cast<uintptr_t>(blocks[1]), forward, [] { return true; }).action,
            Action::kDeferred);
  EXPECT_EQ(gauge.load(), 2 * MemoryBudget::kKeptUnit);
  // Short of the margin: a free is the driver's.
  files.Set(1000 * kM, 950 * kM, 100000 * kM);
  EXPECT_GT(budget.ShortOf(budget.margin()), 0u);
  EXPECT_EQ(cache.Free(reinterpret_cast<uintptr_t>(blocks[2]), forward, [] { return true; }).action,
            Action::kForward);
  EXPECT_EQ(forwarded, 1);
  free(blocks[2]);  // the fake program free did not free it
  // Yield: the oldest kept block goes first, with reason pressure.
  EXPECT_TRUE(cache.ReleaseOldest(EvictReason::kPressure));
  EXPECT_EQ(cache.Counters().releases[static_cast<int>(EvictReason::kPressure)], 1u);
  EXPECT_EQ(gauge.load(), MemoryBudget::kKeptUnit);
  void* again = nullptr;  // the second block is still served
  EXPECT_EQ(cache.Alloc(HostAllocRequest{4096, 0, ctx, 0}, &again, [] { return kCudaOutOfMemory; })
                .action,
            Action::kHit);
  EXPECT_EQ(again, blocks[1]);
  EXPECT_FALSE(cache.ReleaseOldest(EvictReason::kPressure));
  EXPECT_EQ(gauge.load(), 0);
  free(again);
}

}  // namespace
}  // namespace lazypin
