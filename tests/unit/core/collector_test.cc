// The collector (shim/core/collector.h) without any hooks: a pool on a fake driver,
// real malloc'd blocks handed over as the free hook does, a fake "real free".
// Checks the order that hazard 1 needs (the driver's unregister before the
// block is freed), that nothing handed over is lost, and idle release.
#include "collector.h"

#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "driver_model.h"
#include "gtest/gtest.h"
#include "pool.h"
#include "thread_state.h"

namespace lazypin {
namespace {

const Context kCtx = reinterpret_cast<Context>(0x11);

// Everything the driver and the "real free" saw, in order, from any thread.
std::mutex g_mu;
std::vector<std::string> g_events;
model::DriverModel g_model;
std::atomic<int64_t> g_now{0};
std::atomic<bool> g_hold_unregister{false};  // a driver stuck (a busy GPU, a held lock)
std::atomic<bool> g_held{false};             // an unregister is waiting on g_hold_unregister

void Event(std::string e) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_events.push_back(std::move(e));
}

std::string Hex(const void* p) { return absl::StrFormat("%p", p); }

class FakeDriver final : public PoolDriver {
 public:
  int Unregister(uintptr_t ptr, Context, ReleaseWait*) override {
    while (g_hold_unregister.load()) {
      g_held = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    g_held = false;
    Event("unregister " + Hex(reinterpret_cast<void*>(ptr)));
    std::lock_guard<std::mutex> lock(g_mu);
    return g_model.Unregister(ptr);
  }
  bool ReadFrames(uintptr_t, size_t, std::vector<uint64_t>*) override { return false; }
  int64_t NowNs() override { return g_now.load(); }
};

class NullObserver final : public PoolObserver {
 public:
  void OnEvict(uintptr_t, size_t, EvictReason, int, int64_t, const ReleaseWait&) override {}
  void OnWarning(const std::string&) override {}
};

void FakeRealFree(void* p) {
  Event("free " + Hex(p));
  free(p);
}

class CollectorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_events.clear();
    g_model = model::DriverModel();
    pool_ = std::make_unique<Pool>(&driver_, &observer_, DefaultPoolLimits());
  }
  // A malloc'd block, registered and unregistered by "the program": pooled.
  void* PooledBlock(size_t bytes) {
    void* p = malloc(bytes);
    PoolRange(p, bytes);
    return p;
  }
  void PoolRange(void* p, size_t bytes) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    RegisterRequest req{a, bytes, 0, kCtx, 0};
    EXPECT_EQ(pool_->Register(req, [&] {
                std::lock_guard<std::mutex> lock(g_mu);
                return g_model.Register(a, bytes, 0, kCtx);
              }).result, 0);
    EXPECT_EQ(pool_->Unregister(a, [] { return -1; }).action, Action::kDeferred);
  }
  std::vector<std::string> Events() {
    std::lock_guard<std::mutex> lock(g_mu);
    return g_events;
  }
  bool WaitForEvents(size_t n) {
    for (int i = 0; i < 5000 && Events().size() < n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return Events().size() >= n;
  }

  FakeDriver driver_;
  NullObserver observer_;
  std::unique_ptr<Pool> pool_;
};

TEST_F(CollectorTest, HandedOverBlockIsUnregisteredThenFreed) {
  Collector collector(pool_.get(), /*idle_ms=*/0, &FakeRealFree);
  void* p = PooledBlock(100000);
  ASSERT_NE(collector.HandOver(p, malloc_usable_size(p)), 0u);
  ASSERT_TRUE(WaitForEvents(2));
  EXPECT_EQ(Events(), (std::vector<std::string>{"unregister " + Hex(p), "free " + Hex(p)}));
  EXPECT_TRUE(pool_->Empty());
  collector.Stop();
}

TEST_F(CollectorTest, NothingHandedOverIsLostAcrossStop) {
  Collector collector(pool_.get(), 0, &FakeRealFree);
  std::vector<void*> blocks;
  for (int i = 0; i < 200; ++i) blocks.push_back(PooledBlock(4096 + 64 * i));
  for (void* p : blocks) ASSERT_NE(collector.HandOver(p, malloc_usable_size(p)), 0u);
  collector.Stop();  // finishes what the thread had not yet
  void* late = malloc(16);
  EXPECT_EQ(collector.HandOver(late, 16), 0u);  // after Stop the caller frees it
  free(late);
  const std::vector<std::string> events = Events();
  ASSERT_EQ(events.size(), 400u);
  for (void* p : blocks) {
    const auto unreg = std::find(events.begin(), events.end(), "unregister " + Hex(p));
    const auto freed = std::find(events.begin(), events.end(), "free " + Hex(p));
    ASSERT_NE(unreg, events.end());
    ASSERT_NE(freed, events.end());
    EXPECT_LT(unreg, freed) << "freed before it was unregistered: " << Hex(p);
  }
  EXPECT_TRUE(pool_->Empty());
  EXPECT_TRUE(g_model.regs().empty());
}

TEST_F(CollectorTest, WaitFreedReturnsOnceTheBlockIsFreed) {
  Collector collector(pool_.get(), 0, &FakeRealFree);
  void* p = PooledBlock(1 << 20);
  const uint64_t ticket = collector.HandOver(p, 1 << 20);
  ASSERT_NE(ticket, 0u);
  ASSERT_TRUE(collector.WaitFreed(ticket, 5000));
  EXPECT_EQ(Events().back(), "free " + Hex(p));  // freed before WaitFreed returned
  EXPECT_EQ(collector.PendingBytes(), 0u);
  collector.Stop();
}

TEST_F(CollectorTest, WaitFreedGivesUpWhenTheDriverIsStuck) {
  Collector collector(pool_.get(), 0, &FakeRealFree);
  void* p = PooledBlock(4096);
  g_hold_unregister = true;
  const uint64_t ticket = collector.HandOver(p, 4096);
  EXPECT_FALSE(collector.WaitFreed(ticket, 50));  // bounded: the caller goes on
  EXPECT_EQ(collector.PendingBytes(), 4096u);
  g_hold_unregister = false;
  EXPECT_TRUE(collector.WaitFreed(ticket, 5000));
  EXPECT_EQ(Events(), (std::vector<std::string>{"unregister " + Hex(p), "free " + Hex(p)}));
  collector.Stop();
}

TEST_F(CollectorTest, BlockWithNothingPooledIsJustFreed) {
  Collector collector(pool_.get(), 0, &FakeRealFree);
  void* p = malloc(64);
  ASSERT_NE(collector.HandOver(p, malloc_usable_size(p)), 0u);
  ASSERT_TRUE(WaitForEvents(1));
  EXPECT_EQ(Events(), (std::vector<std::string>{"free " + Hex(p)}));
  collector.Stop();
}

TEST_F(CollectorTest, TakeFreeWaitsOnlyPastThePendingBound) {
  FreeBounds bounds;
  bounds.max_pending_bytes = 8192;
  bounds.pending_wait_ms = 5000;
  Collector collector(pool_.get(), 0, &FakeRealFree, bounds);
  void* small = PooledBlock(4096);
  void* big = PooledBlock(1 << 16);
  g_hold_unregister = true;  // nothing handed over gets freed for now
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(collector.TakeFree(small, 4096, /*may_wait=*/true));  // under the bound: no wait
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  std::thread release([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    g_hold_unregister = false;
  });
  ASSERT_TRUE(collector.TakeFree(big, 1 << 16, /*may_wait=*/true));  // past it: waits for its block
  const std::vector<std::string> events = Events();
  EXPECT_NE(std::find(events.begin(), events.end(), "free " + Hex(big)), events.end())
      << "freed before TakeFree returned";
  release.join();
  collector.Stop();
}

TEST_F(CollectorTest, TakeFreeWaitIsBounded) {
  FreeBounds bounds;
  bounds.max_pending_bytes = 0;
  bounds.pending_wait_ms = 50;
  Collector collector(pool_.get(), 0, &FakeRealFree, bounds);
  void* p = PooledBlock(4096);
  g_hold_unregister = true;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(collector.TakeFree(p, 4096, /*may_wait=*/true));
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, std::chrono::milliseconds(45));
  EXPECT_LT(waited, std::chrono::seconds(2));
  g_hold_unregister = false;
  collector.Stop();
  EXPECT_EQ(collector.PendingBytes(), 0u);
}

TEST_F(CollectorTest, TakeFreeRefusesOnceStopped) {
  Collector collector(pool_.get(), 0, &FakeRealFree);
  collector.Stop();
  void* p = malloc(64);
  EXPECT_FALSE(collector.TakeFree(p, 64, /*may_wait=*/true));  // the caller frees it
  free(p);
}

Collector* g_signal_collector = nullptr;
void* g_signal_block = nullptr;
void HandOverFromSignal(int) { g_signal_collector->HandOver(g_signal_block, 8192); }

TEST_F(CollectorTest, HandOverFromASignalHandler) {
  Collector collector(pool_.get(), 0, &FakeRealFree);
  g_signal_collector = &collector;
  g_signal_block = PooledBlock(8192);
  struct sigaction sa = {}, old;
  sa.sa_handler = HandOverFromSignal;
  sigaction(SIGUSR1, &sa, &old);
  raise(SIGUSR1);
  sigaction(SIGUSR1, &old, nullptr);
  ASSERT_TRUE(WaitForEvents(2));
  EXPECT_EQ(Events()[0], "unregister " + Hex(g_signal_block));
  EXPECT_EQ(Events()[1], "free " + Hex(g_signal_block));
  collector.Stop();
}

// Blocks of 1 and 8 bytes side by side, as jemalloc, tcmalloc or a program's
// own allocator keep them: the hand-over writes neither into the freed block
// nor into its neighbours (the "real free" here checks, then frees nothing).
alignas(64) unsigned char g_arena[64];
constexpr unsigned char kCanary = 0xA5;
std::atomic<int> g_arena_frees{0};
std::atomic<bool> g_arena_intact_at_free{false};
bool ArenaIntact() {
  return std::all_of(std::begin(g_arena), std::end(g_arena),
                     [](unsigned char c) { return c == kCanary; });
}
void CheckArenaFree(void* p) {
  g_arena_intact_at_free = ArenaIntact();
  g_arena_frees++;
  Event("free " + Hex(p));
}

TEST_F(CollectorTest, HandOverWritesNeitherTheBlockNorItsNeighbours) {
  for (size_t bytes : {size_t{1}, size_t{8}}) {
    SCOPED_TRACE(bytes);
    std::fill(std::begin(g_arena), std::end(g_arena), kCanary);
    g_arena_frees = 0;
    unsigned char* block = g_arena + 24;  // neighbours on both sides, 8-aligned
    PoolRange(block, bytes);
    Collector collector(pool_.get(), 0, &CheckArenaFree);
    const uint64_t ticket = collector.HandOver(block, bytes);
    ASSERT_NE(ticket, 0u);
    EXPECT_TRUE(ArenaIntact()) << "written by the hand-over itself";
    ASSERT_TRUE(collector.WaitFreed(ticket, 5000));
    EXPECT_EQ(g_arena_frees.load(), 1);
    EXPECT_TRUE(g_arena_intact_at_free.load()) << "written before the real free";
    EXPECT_TRUE(ArenaIntact());
    EXPECT_TRUE(pool_->Empty());
    collector.Stop();
  }
}

TEST_F(CollectorTest, ASecondFreeOfAPendingBlockMakesTheFirstBeforeReturning) {
  Collector collector(pool_.get(), 0, &FakeRealFree);
  // Above glibc's largest mmap threshold (32 MiB): mmapped whatever earlier
  // frees in this process did to the threshold, so no page is shared.
  constexpr size_t kBlock = size_t{64} << 20;
  void* stuck = PooledBlock(kBlock);
  void* pending = PooledBlock(kBlock);
  g_hold_unregister = true;
  ASSERT_NE(collector.HandOver(stuck, kBlock), 0u);
  for (int i = 0; i < 5000 && !g_held.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(g_held.load()) << "the collector is freeing the stuck block";
  ASSERT_NE(collector.HandOver(pending, kBlock), 0u);
  int other = 0;
  EXPECT_EQ(collector.FreedAgain(&other, 10), Collector::Again::kNotPending);
  // The stuck one is the collector's: waited for (here past the bound).
  EXPECT_EQ(collector.FreedAgain(stuck, 20), Collector::Again::kTimedOut);
  g_hold_unregister = false;
  // The pending one, if still in its slot, is taken back and freed on this
  // thread; else waited for. Either way it is freed once, before this returns.
  {
    ScopedInsideLazypin inside;
    EXPECT_EQ(collector.FreedAgain(pending, 5000), Collector::Again::kDone);
  }
  const std::vector<std::string> events = Events();
  EXPECT_EQ(std::count(events.begin(), events.end(), "free " + Hex(pending)), 1);
  ASSERT_TRUE(collector.WaitHandedFrees(5000));
  EXPECT_EQ(collector.FreedAgain(pending, 10), Collector::Again::kNotPending);
  const std::vector<std::string> after = Events();
  EXPECT_EQ(std::count(after.begin(), after.end(), "free " + Hex(stuck)), 1);
  EXPECT_EQ(std::count(after.begin(), after.end(), "free " + Hex(pending)), 1);
  collector.Stop();
}

TEST_F(CollectorTest, AllSlotsTakenRefusesThenRecovers) {
  Collector collector(pool_.get(), 0, &FakeRealFree);
  void* stuck = PooledBlock(4096);
  g_hold_unregister = true;
  ASSERT_NE(collector.HandOver(stuck, 4096), 0u);
  for (int i = 0; i < 5000 && !g_held.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(g_held.load()) << "the collector took the stuck block";
  // The stuck block's slot is free again; every other one fills up now.
  std::vector<void*> blocks;
  uint64_t last = 0;
  for (size_t i = 0; i < Collector::kSlots; ++i) {
    blocks.push_back(malloc(16));
    last = collector.HandOver(blocks.back(), 16);
    ASSERT_NE(last, 0u) << "slot " << i;
  }
  void* extra = malloc(16);
  EXPECT_EQ(collector.HandOver(extra, 16), 0u) << "more than kSlots pending";
  EXPECT_FALSE(collector.TakeFree(extra, 16, /*may_wait=*/true));  // the caller's free
  EXPECT_FALSE(collector.TakeFree(extra, 16, /*may_wait=*/false));
  EXPECT_EQ(collector.PendingBytes(), 4096u + 16 * Collector::kSlots);
  g_hold_unregister = false;
  ASSERT_TRUE(collector.WaitFreed(last, 10000));
  EXPECT_EQ(collector.PendingBytes(), 0u);
  const uint64_t again = collector.HandOver(extra, 16);  // slots free again
  ASSERT_NE(again, 0u);
  ASSERT_TRUE(collector.WaitFreed(again, 5000));
  const std::vector<std::string> events = Events();
  ASSERT_EQ(events.size(), Collector::kSlots + 3);  // one unregister, every block freed once
  EXPECT_EQ(events[0], "unregister " + Hex(stuck));
  std::vector<std::string> freed(events.begin() + 1, events.end());
  std::sort(freed.begin(), freed.end());
  EXPECT_EQ(std::adjacent_find(freed.begin(), freed.end()), freed.end()) << "a block freed twice";
  collector.Stop();
}

// Signal handlers hand over while the thread they interrupt hands over too
// (possibly between its claim of a slot and its publishing it).
Collector* g_race_collector = nullptr;
std::vector<void*> g_handler_blocks;
std::atomic<size_t> g_handler_next{0};
std::atomic<size_t> g_handler_handed{0};
void HandOverNextFromSignal(int) {
  const size_t i = g_handler_next.fetch_add(1);
  if (i >= g_handler_blocks.size()) return;
  if (g_race_collector->HandOver(g_handler_blocks[i], 32) != 0) {
    g_handler_handed++;
    g_handler_blocks[i] = nullptr;  // the collector's now
  }
}

TEST_F(CollectorTest, HandOverFromSignalHandlersInterruptingHandOvers) {
  Collector collector(pool_.get(), 0, &FakeRealFree);
  constexpr int kThreadFrees = 20000, kSignals = 500;
  g_race_collector = &collector;
  g_handler_blocks.clear();
  g_handler_next = 0;
  g_handler_handed = 0;
  for (int i = 0; i < kSignals; ++i) g_handler_blocks.push_back(malloc(32));
  struct sigaction sa = {}, old;
  sa.sa_handler = HandOverNextFromSignal;
  sigaction(SIGUSR1, &sa, &old);
  std::atomic<bool> started{false};
  std::thread worker([&] {
    started = true;
    for (int i = 0; i < kThreadFrees; ++i) {
      void* p = malloc(24);
      while (collector.HandOver(p, 24) == 0) std::this_thread::yield();  // full: wait here
    }
  });
  while (!started) std::this_thread::yield();
  for (int i = 0; i < kSignals; ++i) {
    pthread_kill(worker.native_handle(), SIGUSR1);
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  worker.join();
  sigaction(SIGUSR1, &old, nullptr);
  collector.Stop();
  // Not handed over: signals that merged, or all slots taken at the time.
  for (void* p : g_handler_blocks) free(p);
  const size_t handled = g_handler_handed.load();
  EXPECT_GT(handled, 0u);
  EXPECT_EQ(Events().size(), kThreadFrees + handled) << "each block freed exactly once";
  EXPECT_EQ(collector.PendingBytes(), 0u);
}

TEST_F(CollectorTest, ReleasesIdleEntries) {
  void* p = PooledBlock(4096);
  g_now = int64_t{1} << 40;  // everything pooled is now long idle
  Collector collector(pool_.get(), /*idle_ms=*/20, &FakeRealFree);
  ASSERT_TRUE(WaitForEvents(1));
  EXPECT_EQ(Events(), (std::vector<std::string>{"unregister " + Hex(p)}));
  collector.Stop();
  g_now = 0;
  free(p);
}

}  // namespace
}  // namespace lazypin
