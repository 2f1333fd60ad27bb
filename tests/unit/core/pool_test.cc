// Focused tests of each rule of the pool (shim/core/pool.h), against a fake driver
// that keeps the driver's semantics (driver_model.h) and logs every call in order.
#include "pool.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "driver_model.h"
#include "fake_pool_driver.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lazypin {
namespace {

using model::DriverModel;
using model::kPage;
using ::testing::ElementsAre;

constexpr uintptr_t kA = 0x100000;        // page aligned
constexpr uintptr_t kB = 0x200000;
constexpr uintptr_t kC = 0x300000;
const Context kCtx1 = reinterpret_cast<Context>(0x11);
const Context kCtx2 = reinterpret_cast<Context>(0x22);

using FakeDriver = FakePoolDriver;
using FakeObserver = FakePoolObserver;

class PoolTest : public ::testing::Test {
 protected:
  void MakePool(PoolLimits limits) { pool_ = std::make_unique<Pool>(&driver_, &observer_, limits); }
  void SetUp() override { MakePool(DefaultPoolLimits()); }

  // The program's register: the pool decides, `forward` is the driver's call.
  Outcome Reg(uintptr_t ptr, size_t bytes, unsigned flags = 0, Context ctx = kCtx1,
              int device = 0) {
    RegisterRequest req{ptr, bytes, flags, ctx, device};
    return pool_->Register(req, [&] {
      driver_.log.push_back("register " + Hex(ptr));
      return driver_.model.Register(ptr, bytes, flags, ctx);
    });
  }
  // A register whose driver call returns `result` whatever the state.
  Outcome RegScripted(uintptr_t ptr, size_t bytes, std::vector<int> results) {
    RegisterRequest req{ptr, bytes, 0, kCtx1, 0};
    size_t call = 0;
    return pool_->Register(req, [&] {
      driver_.log.push_back("register " + Hex(ptr));
      const int r = results.at(call++);
      if (r == 0) driver_.model.Register(ptr, bytes, 0, kCtx1);
      return r;
    });
  }
  Outcome Unreg(uintptr_t ptr) {
    return pool_->Unregister(ptr, [&] {
      driver_.log.push_back("unregister " + Hex(ptr));
      return driver_.model.Unregister(ptr);
    });
  }
  // Registers and unregisters: leaves one deferred entry.
  void Defer(uintptr_t ptr, size_t bytes, unsigned flags = 0, Context ctx = kCtx1, int device = 0) {
    ASSERT_EQ(Reg(ptr, bytes, flags, ctx, device).result, 0);
    ASSERT_EQ(Unreg(ptr).action, Action::kDeferred);
  }
  uint64_t Evictions(EvictReason r) { return pool_->Counters().evictions[static_cast<int>(r)]; }

  FakeDriver driver_;
  FakeObserver observer_;
  std::unique_ptr<Pool> pool_;
};

TEST_F(PoolTest, ExactMatchHitsWithoutCallingTheDriver) {
  const Outcome miss = Reg(kA, 4 * kPage, 1, kCtx1);
  EXPECT_EQ(miss.action, Action::kMiss);
  EXPECT_EQ(miss.result, 0);
  const Outcome deferred = Unreg(kA);
  EXPECT_EQ(deferred.action, Action::kDeferred);
  EXPECT_EQ(deferred.result, 0);
  EXPECT_NE(driver_.model.Find(kA), nullptr) << "a deferred registration stays in the driver";
  driver_.log.clear();

  const Outcome hit = Reg(kA, 4 * kPage, 1, kCtx1);
  EXPECT_EQ(hit.action, Action::kHit);
  EXPECT_EQ(hit.result, 0);
  EXPECT_EQ(hit.evicted, 0);
  EXPECT_TRUE(driver_.log.empty());
  // The hit is in use again: a second register of it is the driver's business (712).
  const Outcome again = Reg(kA, 4 * kPage, 1, kCtx1);
  EXPECT_EQ(again.result, model::kAlreadyRegistered);
  EXPECT_EQ(again.action, Action::kMiss);
  const PoolCounters c = pool_->Counters();
  EXPECT_EQ(c.hits, 1u);
  EXPECT_EQ(c.misses, 2u);
  EXPECT_EQ(c.deferred, 1u);
  EXPECT_EQ(c.pooled_entries, 0u);
  EXPECT_EQ(c.pooled_bytes, 0u);
}

TEST_F(PoolTest, DifferentSizeFlagsOrContextAtTheSameBaseEvictsBeforeForwarding) {
  struct Variant { const char* name; size_t bytes; unsigned flags; Context ctx; };
  const Variant variants[] = {{"bytes", 2 * kPage, 0, kCtx1},
                              {"bytes, sub-range", kPage / 2, 0, kCtx1},
                              {"flags", kPage, 2, kCtx1},
                              {"context", kPage, 0, kCtx2}};
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.name);
    driver_ = FakeDriver();
    observer_ = FakeObserver();
    MakePool(DefaultPoolLimits());
    Defer(kA, kPage, 0, kCtx1);
    driver_.log.clear();
    const Outcome out = Reg(kA, v.bytes, v.flags, v.ctx);
    EXPECT_EQ(out.action, Action::kMiss);
    EXPECT_EQ(out.result, 0);
    EXPECT_EQ(out.evicted, 1);
    EXPECT_THAT(driver_.log, ElementsAre("evict " + Hex(kA), "register " + Hex(kA)));
    EXPECT_THAT(observer_.evicts, ElementsAre("overlap " + Hex(kA) + " 0"));
    EXPECT_EQ(driver_.eviction_ctx.at(0), kCtx1) << "evicted in its own context";
    EXPECT_EQ(Evictions(EvictReason::kOverlap), 1u);
    EXPECT_EQ(pool_->Counters().hits, 0u);
  }
}

TEST_F(PoolTest, DeferredEntrySharingAPageIsEvictedBeforeARegister) {
  Defer(kA, 100);  // bytes [kA, kA+100), page kA
  driver_.log.clear();
  const Outcome out = Reg(kA + 200, 100);  // same page, bytes disjoint
  EXPECT_EQ(out.evicted, 1);
  EXPECT_THAT(driver_.log, ElementsAre("evict " + Hex(kA), "register " + Hex(kA + 200)));
  // A register on another page leaves a deferred one alone.
  Defer(kB, 100);
  driver_.log.clear();
  EXPECT_EQ(Reg(kB + kPage, 100).evicted, 0);
  EXPECT_THAT(driver_.log, ElementsAre("register " + Hex(kB + kPage)));
}

TEST_F(PoolTest, OverlapWithAnInUseEntryOnlyForwards) {
  ASSERT_EQ(Reg(kA, 100).result, 0);  // in use: [kA, kA+100)
  Defer(kA + 200, 100);                // deferred, same page
  driver_.log.clear();
  // Overlaps the in-use one: the driver answers (712), nothing is evicted.
  Outcome out = Reg(kA + 50, 200);
  EXPECT_EQ(out.result, model::kAlreadyRegistered);
  EXPECT_EQ(out.evicted, 0);
  EXPECT_THAT(driver_.log, ElementsAre("register " + Hex(kA + 50)));
  EXPECT_EQ(pool_->Counters().pooled_entries, 1u);
  // Whatever the driver returns is what the program gets.
  for (int code : {999, 2, 0}) {
    driver_.log.clear();
    out = RegScripted(kA + 10, 20, {code});
    EXPECT_EQ(out.result, code);
    EXPECT_EQ(out.action, Action::kMiss);
    EXPECT_THAT(driver_.log, ElementsAre("register " + Hex(kA + 10))) << "no retry, no eviction";
    if (code == 0) break;  // the driver took it: the pool forgot the old in-use entry
  }
}

TEST_F(PoolTest, UnregisterOfAnAlreadyUnregisteredPointerEvictsThenForwards) {
  Defer(kA, kPage);
  driver_.log.clear();
  const Outcome out = Unreg(kA);  // the program unregisters it a second time
  EXPECT_EQ(out.action, Action::kForward);
  EXPECT_EQ(out.evicted, 1);
  EXPECT_EQ(out.result, model::kNotRegistered) << "the driver itself answered 713";
  EXPECT_THAT(driver_.log, ElementsAre("evict " + Hex(kA), "unregister " + Hex(kA)));
  EXPECT_EQ(driver_.model.Find(kA), nullptr);
  EXPECT_TRUE(pool_->Empty());
  // Unknown and null pointers go straight to the driver.
  driver_.log.clear();
  EXPECT_EQ(Unreg(kB).result, model::kNotRegistered);
  EXPECT_EQ(Unreg(0).result, model::kInvalidValue);
  EXPECT_EQ(Unreg(0).action, Action::kForward);
  EXPECT_THAT(driver_.log, ElementsAre("unregister " + Hex(kB), "unregister 0x0", "unregister 0x0"));
}

TEST_F(PoolTest, UnregisterOfAnInteriorPointer) {
  ASSERT_EQ(Reg(kA, 2 * kPage).result, 0);
  driver_.log.clear();
  // Of an in-use entry: forwarded, the driver says invalid, the entry stays in use.
  Outcome out = Unreg(kA + 8);
  EXPECT_EQ(out.action, Action::kForward);
  EXPECT_EQ(out.result, model::kInvalidValue);
  EXPECT_EQ(out.evicted, 0);
  EXPECT_THAT(driver_.log, ElementsAre("unregister " + Hex(kA + 8)));
  EXPECT_EQ(Unreg(kA).action, Action::kDeferred);
  // Of a deferred entry: evicted first, then the driver says not registered.
  driver_.log.clear();
  out = Unreg(kA + kPage);
  EXPECT_EQ(out.evicted, 1);
  EXPECT_EQ(out.result, model::kNotRegistered);
  EXPECT_THAT(driver_.log, ElementsAre("evict " + Hex(kA), "unregister " + Hex(kA + kPage)));
}

TEST_F(PoolTest, EntryBoundEvictsLeastRecentlyUsedFirst) {
  PoolLimits limits = DefaultPoolLimits();
  limits.max_entries = 2;
  MakePool(limits);
  Defer(kA, kPage);
  Defer(kB, kPage);
  // A hit and a second deferral make kA the most recent.
  ASSERT_EQ(Reg(kA, kPage).action, Action::kHit);
  ASSERT_EQ(Unreg(kA).action, Action::kDeferred);
  ASSERT_EQ(Reg(kC, kPage).result, 0);
  driver_.log.clear();
  const Outcome out = Unreg(kC);
  EXPECT_EQ(out.action, Action::kDeferred);
  EXPECT_EQ(out.evicted, 1);
  EXPECT_THAT(driver_.log, ElementsAre("evict " + Hex(kB)));
  EXPECT_THAT(observer_.evicts, ElementsAre("lru " + Hex(kB) + " 0"));
  const PoolCounters c = pool_->Counters();
  EXPECT_EQ(c.pooled_entries, 2u);
  EXPECT_EQ(c.peak_entries, 3u) << "the peak counts the moment before the eviction";
  EXPECT_EQ(c.evictions[static_cast<int>(EvictReason::kLru)], 1u);
}

TEST_F(PoolTest, ByteBoundEvictsLeastRecentlyUsedFirst) {
  PoolLimits limits = DefaultPoolLimits();
  limits.max_bytes = 5 * kPage;
  MakePool(limits);
  Defer(kA, 2 * kPage);
  Defer(kB, 2 * kPage);
  ASSERT_EQ(Reg(kC, 3 * kPage).result, 0);
  driver_.log.clear();
  const Outcome out = Unreg(kC);  // 7 pages pooled > 5: the oldest (kA) goes
  EXPECT_EQ(out.action, Action::kDeferred);
  EXPECT_EQ(out.evicted, 1);
  EXPECT_THAT(driver_.log, ElementsAre("evict " + Hex(kA)));
  const PoolCounters c = pool_->Counters();
  EXPECT_EQ(c.pooled_bytes, 5 * kPage);
  EXPECT_EQ(c.peak_bytes, 7 * kPage) << "the peak counts the moment before the eviction";
}

TEST_F(PoolTest, TooLargeToPoolIsForwarded) {
  PoolLimits limits = DefaultPoolLimits();
  limits.max_bytes = kPage;
  MakePool(limits);
  ASSERT_EQ(Reg(kA, 2 * kPage).result, 0);
  driver_.log.clear();
  const Outcome out = Unreg(kA);
  EXPECT_EQ(out.action, Action::kForward);
  EXPECT_EQ(out.result, 0);
  EXPECT_THAT(driver_.log, ElementsAre("unregister " + Hex(kA)));
  EXPECT_EQ(driver_.model.Find(kA), nullptr);
  // A pool with room for no entry forwards everything.
  limits = DefaultPoolLimits();
  limits.max_entries = 0;
  MakePool(limits);
  ASSERT_EQ(Reg(kB, kPage).result, 0);
  EXPECT_EQ(Unreg(kB).action, Action::kForward);
  EXPECT_EQ(driver_.model.Find(kB), nullptr);
}

TEST_F(PoolTest, AnUnregisterThatMayNotBeDeferredIsForwardedAndKeptOnFailure) {
  ASSERT_EQ(Reg(kA, kPage).result, 0);
  driver_.log.clear();
  // The driver refuses (no current context: 201) and keeps it: so does the pool.
  Outcome out = pool_->Unregister(kA, [&] {
    driver_.log.push_back("unregister " + Hex(kA));
    return 201;
  }, /*may_defer=*/false);
  EXPECT_EQ(out.action, Action::kForward);
  EXPECT_EQ(out.result, 201);
  EXPECT_NE(driver_.model.Find(kA), nullptr);
  EXPECT_TRUE(pool_->MaybeTracks(kA, kA + 1)) << "still in use, still watched";
  // Deferrable again, then a second unregister is the driver's (713).
  EXPECT_EQ(Unreg(kA).action, Action::kDeferred);
  out = Unreg(kA);
  EXPECT_EQ(out.result, model::kNotRegistered);
  EXPECT_THAT(driver_.log, ElementsAre("unregister " + Hex(kA), "evict " + Hex(kA),
                                       "unregister " + Hex(kA)));
  // may_defer false on an entry the driver unregisters: forwarded, forgotten.
  ASSERT_EQ(Reg(kB, kPage).result, 0);
  out = pool_->Unregister(kB, [&] { return driver_.model.Unregister(kB); }, false);
  EXPECT_EQ(out.action, Action::kForward);
  EXPECT_EQ(out.result, 0);
  EXPECT_TRUE(pool_->Empty());
  EXPECT_FALSE(pool_->Tracking());
}

TEST_F(PoolTest, MemoryThatLeftWhileRegisteredIsNeverDeferred) {
  ASSERT_EQ(Reg(kA, 2 * kPage).result, 0);
  ASSERT_EQ(Reg(kB, kPage).result, 0);
  EXPECT_TRUE(pool_->Tracking());
  EXPECT_TRUE(pool_->MaybeTracks(kA + kPage, kA + kPage + 1));
  EXPECT_FALSE(pool_->MaybeHolds(kA, kA + 1)) << "in use: the copy hooks' view is deferred only";
  // munmap of the second page of A while the program holds it registered.
  EXPECT_EQ(pool_->MarkLeft(kA + kPage, kA + 2 * kPage), 1);
  EXPECT_EQ(pool_->MarkLeft(kA, kA + kPage), 0) << "marked once";
  driver_.log.clear();
  // The program's unregister goes to the driver, which answers (0, as without lazypin).
  Outcome out = Unreg(kA);
  EXPECT_EQ(out.action, Action::kPassthrough);
  EXPECT_EQ(out.reason, PassReason::kLeft);
  EXPECT_EQ(out.result, 0);
  EXPECT_THAT(driver_.log, ElementsAre("unregister " + Hex(kA)));
  EXPECT_EQ(driver_.model.Find(kA), nullptr);
  // The address mapped again and registered: a miss, then deferrable as usual.
  EXPECT_EQ(Reg(kA, 2 * kPage).action, Action::kMiss);
  EXPECT_EQ(Unreg(kA).action, Action::kDeferred);
  // B was not touched: deferred.
  EXPECT_EQ(Unreg(kB).action, Action::kDeferred);
}

TEST_F(PoolTest, MemoryThatLeftWhileRegisteredStillOverlapsForTheDriver) {
  ASSERT_EQ(Reg(kA, kPage).result, 0);
  EXPECT_EQ(pool_->MarkLeft(kA, kA + kPage), 1);
  EXPECT_FALSE(pool_->Tracking()) << "a marked entry needs no memory hook";
  // Registered again without an unregister: the driver still holds it (712).
  const Outcome out = Reg(kA, kPage);
  EXPECT_EQ(out.action, Action::kMiss);
  EXPECT_EQ(out.result, model::kAlreadyRegistered);
  EXPECT_EQ(Unreg(kA).action, Action::kPassthrough);
  EXPECT_EQ(driver_.model.Find(kA), nullptr);
}

TEST_F(PoolTest, ReleaseAllBeforeForkReleasesDeferredAndKeepsInUse) {
  Defer(kA, kPage);
  ASSERT_EQ(Reg(kB, kPage).result, 0);
  EXPECT_EQ(pool_->ReleaseAll(EvictReason::kFork), 1);
  EXPECT_THAT(observer_.evicts, ElementsAre("fork " + Hex(kA) + " 0"));
  EXPECT_EQ(Evictions(EvictReason::kFork), 1u);
  EXPECT_NE(driver_.model.Find(kB), nullptr);
  EXPECT_EQ(Unreg(kB).action, Action::kDeferred);
}

TEST_F(PoolTest, ABatchOfReleasesWaitsOncePerContext) {
  Defer(kA, kPage);
  Defer(kB, kPage);
  Defer(kC, kPage, 0, kCtx2);
  EXPECT_EQ(pool_->ReleaseAll(EvictReason::kFork), 3);
  EXPECT_THAT(driver_.eviction_ctx, ElementsAre(kCtx1, kCtx1, kCtx2));
  EXPECT_THAT(driver_.after_wait, ElementsAre(false, true, false))
      << "the second release of kCtx1 follows the first's wait; kCtx2's waits";
}

TEST_F(PoolTest, OutOfMemoryReleasesEverythingPooledAndRetriesOnce) {
  Defer(kA, kPage);
  Defer(kB, kPage);
  driver_.log.clear();
  const Outcome out = RegScripted(kC, kPage, {model::kOutOfMemory, 0});
  EXPECT_EQ(out.result, 0);
  EXPECT_EQ(out.action, Action::kMiss);
  EXPECT_EQ(out.evicted, 2);
  EXPECT_THAT(driver_.log, ElementsAre("register " + Hex(kC), "evict " + Hex(kA),
                                       "evict " + Hex(kB), "register " + Hex(kC)));
  EXPECT_EQ(Evictions(EvictReason::kMakeRoom), 2u);
  EXPECT_TRUE(pool_->Empty());
  // Only once: a second failure is the program's.
  Defer(kA, kPage);
  driver_.log.clear();
  const Outcome twice = RegScripted(kB, kPage, {model::kOutOfMemory, model::kOutOfMemory});
  EXPECT_EQ(twice.result, model::kOutOfMemory);
  EXPECT_THAT(driver_.log,
              ElementsAre("register " + Hex(kB), "evict " + Hex(kA), "register " + Hex(kB)));
  // With nothing pooled there is no retry.
  driver_.log.clear();
  const Outcome empty = RegScripted(kB, kPage, {model::kOutOfMemory});
  EXPECT_EQ(empty.result, model::kOutOfMemory);
  EXPECT_EQ(empty.evicted, 0);
  EXPECT_THAT(driver_.log, ElementsAre("register " + Hex(kB)));
}

TEST_F(PoolTest, InvalidateEvictsDeferredEntriesOverlappingTheRange) {
  EXPECT_FALSE(pool_->MaybeHolds(0, ~uintptr_t{0})) << "empty pool";
  EXPECT_EQ(pool_->Invalidate(kA, kA + kPage, EvictReason::kFree), 0);
  Defer(kA + 100, 200);      // [kA+100, kA+300)
  Defer(kB, 2 * kPage);
  ASSERT_EQ(Reg(kC, kPage).result, 0);  // in use: never evicted by Invalidate
  EXPECT_TRUE(pool_->MaybeHolds(kA, kA + kPage));
  driver_.log.clear();

  // Page-sharing neighbours whose bytes do not overlap stay: the page itself remains.
  EXPECT_EQ(pool_->Invalidate(kA, kA + 100, EvictReason::kFree), 0);
  EXPECT_EQ(pool_->Invalidate(kA + 300, kA + kPage, EvictReason::kFree), 0);
  EXPECT_EQ(pool_->Invalidate(kC, kC + kPage, EvictReason::kMunmap), 0);
  EXPECT_EQ(pool_->Invalidate(kB, kB, EvictReason::kMunmap), 0) << "empty range";
  EXPECT_TRUE(driver_.log.empty());
  // A partial overlap, by one byte at either end.
  EXPECT_EQ(pool_->Invalidate(kA, kA + 101, EvictReason::kFree), 1);
  EXPECT_EQ(pool_->Invalidate(kB + 2 * kPage - 1, kB + 3 * kPage, EvictReason::kMadvise), 1);
  EXPECT_THAT(driver_.log, ElementsAre("evict " + Hex(kA + 100), "evict " + Hex(kB)));
  EXPECT_THAT(observer_.evicts,
              ElementsAre("free " + Hex(kA + 100) + " 0", "madvise " + Hex(kB) + " 0"));
  EXPECT_TRUE(pool_->Empty());
  EXPECT_FALSE(pool_->MaybeHolds(kA, kA + kPage));
  EXPECT_FALSE(pool_->MaybeHolds(kB, kB + 2 * kPage));
  EXPECT_NE(driver_.model.Find(kC), nullptr);
  // One range over several entries evicts them all.
  Defer(kA, 10);
  Defer(kA + kPage, 10);
  Defer(kA + 2 * kPage + 64, 10);
  EXPECT_EQ(pool_->Invalidate(kA, kA + 2 * kPage + 65, EvictReason::kMunmap), 3);
  EXPECT_EQ(Evictions(EvictReason::kMunmap), 3u);
}

TEST_F(PoolTest, DropContextReleasesItsDeferredAndForgetsItsInUse) {
  Defer(kA, kPage, 0, kCtx1);
  Defer(kB, kPage, 0, kCtx2);
  // Several adjacent in-use entries of the context: every one must be forgotten.
  for (int i = 0; i < 5; ++i) ASSERT_EQ(Reg(kC + i * kPage, kPage, 0, kCtx1).result, 0);
  ASSERT_EQ(Reg(kC + 8 * kPage, kPage, 0, kCtx2).result, 0);
  driver_.log.clear();
  EXPECT_EQ(pool_->DropContext(kCtx1), 1);
  EXPECT_THAT(driver_.log, ElementsAre("evict " + Hex(kA)));
  EXPECT_EQ(Evictions(EvictReason::kContext), 1u);
  driver_.model.DropContext(kCtx1);  // the real destroy
  // The forgotten in-use ones: a later unregister is the driver's (713), not deferred.
  for (int i = 0; i < 5; ++i) {
    SCOPED_TRACE(i);
    const Outcome out = Unreg(kC + i * kPage);
    EXPECT_EQ(out.action, Action::kForward);
    EXPECT_EQ(out.result, model::kNotRegistered);
  }
  // The other context is untouched.
  EXPECT_EQ(Reg(kB, kPage, 0, kCtx2).action, Action::kHit);
  EXPECT_EQ(Unreg(kC + 8 * kPage).action, Action::kDeferred);
}

TEST_F(PoolTest, DropContextForgetsEveryInUseEntryOfManyAdjacentOnes) {
  // Erasing from an absl::btree_map invalidates every iterator: a loop that
  // erases while it walks must take the iterator that erase returns.
  for (int n : {2, 3, 4, 7, 16, 100}) {
    SCOPED_TRACE(n);
    driver_ = FakeDriver();
    MakePool(DefaultPoolLimits());
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(Reg(kA + i * kPage, kPage, 0, i % 3 == 2 ? kCtx2 : kCtx1).result, 0);
    }
    EXPECT_EQ(pool_->DropContext(kCtx1), 0);
    driver_.model.DropContext(kCtx1);
    for (int i = 0; i < n; ++i) {
      const Outcome out = Unreg(kA + i * kPage);
      if (i % 3 == 2) {
        EXPECT_EQ(out.action, Action::kDeferred) << i;
      } else {
        EXPECT_EQ(out.action, Action::kForward) << i << ": a forgotten entry was deferred";
        EXPECT_EQ(out.result, model::kNotRegistered) << i;
      }
    }
  }
}

TEST_F(PoolTest, DropDeviceResetForgetsEveryInUseEntryOfManyAdjacentOnes) {
  for (int n : {2, 3, 4, 7, 16, 100}) {
    SCOPED_TRACE(n);
    driver_ = FakeDriver();
    MakePool(DefaultPoolLimits());
    for (int i = 0; i < n; ++i) ASSERT_EQ(Reg(kA + i * kPage, kPage, 0, kCtx1, 0).result, 0);
    EXPECT_EQ(pool_->DropDevice(0, /*forget_in_use=*/true), 0);
    driver_.model.DropContext(kCtx1);
    for (int i = 0; i < n; ++i) {
      const Outcome out = Unreg(kA + i * kPage);
      EXPECT_EQ(out.action, Action::kForward) << i << ": a forgotten entry was deferred";
    }
  }
}

TEST_F(PoolTest, ARegisterTheDriverAcceptsReplacesStaleOverlappingEntries) {
  // In-use entries the driver forgot behind the pool's back (a context torn
  // down without the hook): the driver accepts a register over them, and the
  // pool must forget all of them, however many.
  for (int n : {2, 3, 5, 16, 60}) {
    SCOPED_TRACE(n);
    driver_ = FakeDriver();
    MakePool(DefaultPoolLimits());
    for (int i = 0; i < n; ++i) ASSERT_EQ(Reg(kA + i * kPage, kPage).result, 0);
    driver_.model.DropContext(kCtx1);  // behind the pool's back
    const Outcome big = Reg(kA, n * kPage);
    ASSERT_EQ(big.result, 0);
    EXPECT_EQ(Unreg(kA).action, Action::kDeferred);
    for (int i = 1; i < n; ++i) {
      const Outcome out = Unreg(kA + i * kPage);
      EXPECT_EQ(out.action, Action::kForward) << i << ": a stale entry survived";
    }
  }
}

TEST_F(PoolTest, DropDeviceReleaseKeepsInUseResetForgetsThem) {
  Defer(kA, kPage, 0, kCtx1, /*device=*/0);
  Defer(kB, kPage, 0, kCtx2, /*device=*/1);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(Reg(kC + i * kPage, kPage, 0, kCtx1, 0).result, 0);
  driver_.log.clear();
  // Release: deferred entries of device 0 go, in-use ones stay pooled-able.
  EXPECT_EQ(pool_->DropDevice(0, /*forget_in_use=*/false), 1);
  EXPECT_THAT(driver_.log, ElementsAre("evict " + Hex(kA)));
  EXPECT_EQ(Unreg(kC).action, Action::kDeferred);
  // Reset: deferred go, in-use ones are forgotten.
  driver_.log.clear();
  EXPECT_EQ(pool_->DropDevice(0, /*forget_in_use=*/true), 1);
  EXPECT_THAT(driver_.log, ElementsAre("evict " + Hex(kC)));
  driver_.model.DropContext(kCtx1);
  for (int i = 1; i < 3; ++i) EXPECT_EQ(Unreg(kC + i * kPage).action, Action::kForward);
  // Device 1 untouched.
  EXPECT_EQ(Reg(kB, kPage, 0, kCtx2, 1).action, Action::kHit);
}

TEST_F(PoolTest, CollectIdleUsesTheDriversClock) {
  EXPECT_EQ(pool_->CollectIdle(0), 0) << "empty";
  driver_.now = 1'000;
  Defer(kA, kPage);
  driver_.now = 5'000'000;
  Defer(kB, kPage);
  driver_.now = 10'000'000;
  driver_.log.clear();
  EXPECT_EQ(pool_->CollectIdle(20'000'000), 0);
  EXPECT_EQ(pool_->CollectIdle(7'000'000), 1);
  EXPECT_THAT(driver_.log, ElementsAre("evict " + Hex(kA)));
  EXPECT_EQ(pool_->CollectIdle(5'000'001), 0) << "kB sat 5 ms";
  EXPECT_EQ(pool_->CollectIdle(5'000'000), 1);
  EXPECT_EQ(Evictions(EvictReason::kIdle), 2u);
  EXPECT_TRUE(pool_->Empty());
  // A hit resets the idle time: the entry re-deferred later is younger.
  driver_.now = 20'000'000;
  Defer(kA, kPage);
  driver_.now = 30'000'000;
  ASSERT_EQ(Reg(kA, kPage).action, Action::kHit);
  ASSERT_EQ(Unreg(kA).action, Action::kDeferred);
  driver_.now = 35'000'000;
  EXPECT_EQ(pool_->CollectIdle(10'000'000), 0);
}

TEST_F(PoolTest, AbandonAfterForkPassesEverythingThrough) {
  Defer(kA, kPage);
  ASSERT_EQ(Reg(kB, kPage).result, 0);
  driver_.log.clear();
  pool_->AbandonAfterFork();
  EXPECT_TRUE(pool_->Abandoned());
  EXPECT_TRUE(pool_->Empty());
  EXPECT_FALSE(pool_->MaybeHolds(kA, kA + kPage));
  EXPECT_EQ(pool_->Invalidate(kA, kA + kPage, EvictReason::kFree), 0);
  EXPECT_EQ(pool_->DropContext(kCtx1), 0);
  EXPECT_EQ(pool_->DropDevice(0, true), 0);
  EXPECT_EQ(pool_->CollectIdle(0), 0);
  EXPECT_EQ(pool_->ReleaseAll(EvictReason::kExit), 0);
  EXPECT_TRUE(driver_.log.empty()) << "the child never evicts";
  const Outcome reg = Reg(kA, kPage);  // would have been a hit
  EXPECT_EQ(reg.action, Action::kForward);
  EXPECT_EQ(reg.result, model::kAlreadyRegistered) << "the driver's own answer";
  const Outcome unreg = Unreg(kB);
  EXPECT_EQ(unreg.action, Action::kForward);
  EXPECT_EQ(unreg.result, 0);
  EXPECT_THAT(driver_.log, ElementsAre("register " + Hex(kA), "unregister " + Hex(kB)));
}

TEST_F(PoolTest, CheckFramesTurnsAHitOnMovedPagesIntoAMiss) {
  PoolLimits limits = DefaultPoolLimits();
  limits.check_frames = true;
  MakePool(limits);
  Defer(kA, kPage);
  // Same pages: a hit.
  EXPECT_EQ(Reg(kA, kPage).action, Action::kHit);
  ASSERT_EQ(Unreg(kA).action, Action::kDeferred);
  // Pages moved behind the hooks' back: a warning, a miss, a pfn eviction, a real register.
  driver_.frame_base = 1000;
  driver_.log.clear();
  const Outcome out = Reg(kA, kPage);
  EXPECT_EQ(out.action, Action::kMiss);
  EXPECT_EQ(out.result, 0);
  EXPECT_EQ(out.evicted, 1);
  EXPECT_THAT(driver_.log, ElementsAre("evict " + Hex(kA), "register " + Hex(kA)));
  ASSERT_EQ(observer_.warnings.size(), 1u);
  EXPECT_NE(observer_.warnings[0].find("LAZYPIN_CHECK_PFN"), std::string::npos);
  EXPECT_EQ(Evictions(EvictReason::kPfn), 1u);
  // The new registration recorded the new frames: the next cycle hits.
  ASSERT_EQ(Unreg(kA).action, Action::kDeferred);
  EXPECT_EQ(Reg(kA, kPage).action, Action::kHit);
  // Frames that cannot be read: trust the hooks.
  ASSERT_EQ(Unreg(kA).action, Action::kDeferred);
  driver_.frames_known = false;
  driver_.frame_base = 2000;
  EXPECT_EQ(Reg(kA, kPage).action, Action::kHit);
  EXPECT_EQ(observer_.warnings.size(), 1u);
}

TEST_F(PoolTest, WithoutCheckFramesFramesAreNeverRead) {
  Defer(kA, kPage);
  driver_.frame_base = 1000;
  EXPECT_EQ(Reg(kA, kPage).action, Action::kHit);
  EXPECT_EQ(driver_.reads, 0);
}

TEST_F(PoolTest, NullAndZeroAreForwarded) {
  Outcome out = Reg(0, kPage);
  EXPECT_EQ(out.action, Action::kForward);
  EXPECT_EQ(out.result, model::kInvalidValue);
  out = Reg(kA, 0);
  EXPECT_EQ(out.action, Action::kForward);
  EXPECT_EQ(out.result, model::kInvalidValue);
  EXPECT_EQ(pool_->Counters().misses, 0u);
}

TEST_F(PoolTest, CountersTrackHitsMissesDeferralsEvictionsAndPeaks) {
  Defer(kA, kPage);
  Defer(kB, 2 * kPage);
  Defer(kC, 3 * kPage);
  EXPECT_EQ(Reg(kA, kPage).action, Action::kHit);
  EXPECT_EQ(Reg(kB, kPage).action, Action::kMiss);  // size differs: evicts kB
  EXPECT_EQ(pool_->Invalidate(kC, kC + 1, EvictReason::kFree), 1);
  EXPECT_EQ(pool_->ReleaseAll(EvictReason::kExit), 0);
  const PoolCounters c = pool_->Counters();
  EXPECT_EQ(c.hits, 1u);
  EXPECT_EQ(c.misses, 4u);
  EXPECT_EQ(c.deferred, 3u);
  EXPECT_EQ(c.evictions[static_cast<int>(EvictReason::kOverlap)], 1u);
  EXPECT_EQ(c.evictions[static_cast<int>(EvictReason::kFree)], 1u);
  EXPECT_EQ(c.evictions[static_cast<int>(EvictReason::kExit)], 0u);
  EXPECT_EQ(c.peak_entries, 3u);
  EXPECT_EQ(c.peak_bytes, 6 * kPage);
  EXPECT_EQ(c.pooled_entries, 0u);
  EXPECT_EQ(c.pooled_bytes, 0u);
}

TEST(PoolNamesTest, EveryReasonAndActionHasItsLogName) {
  EXPECT_STREQ(EvictReasonName(EvictReason::kLru), "lru");
  EXPECT_STREQ(EvictReasonName(EvictReason::kMakeRoom), "make_room");
  EXPECT_STREQ(EvictReasonName(EvictReason::kMmapFixed), "mmap_fixed");
  EXPECT_STREQ(EvictReasonName(EvictReason::kExit), "exit");
  EXPECT_STREQ(EvictReasonName(EvictReason::kFork), "fork");
  EXPECT_STREQ(EvictReasonName(EvictReason::kMprotect), "mprotect");
  EXPECT_STREQ(ActionName(Action::kDeferred), "deferred");
}

}  // namespace
// A copy waits for another thread's eviction of the memory it copies: the
// collector's Drain took the watch's event and unregisters (slowly); the
// copy's own Drain then finds nothing, but the driver still holds that
// registration until the unregister returns.
// A driver whose watch reports the changes a test queues (Change), as the
// kernel's queue does: whichever thread drains next applies them.
class QueuedChangesDriver : public PoolDriver {
 public:
  int Unregister(uintptr_t ptr, Context, ReleaseWait*) override { return model.Unregister(ptr); }
  bool ReadFrames(uintptr_t, size_t, std::vector<uint64_t>*) override { return false; }
  int64_t NowNs() override { return 0; }
  void DrainChanges(DrainScope, absl::FunctionRef<void(uintptr_t, uintptr_t)> changed) override {
    std::vector<std::pair<uintptr_t, uintptr_t>> taken;
    {
      std::lock_guard<std::mutex> lock(mu);
      taken.swap(changes);
    }
    for (auto [lo, hi] : taken) changed(lo, hi);
  }
  void Change(uintptr_t lo, uintptr_t hi) {
    std::lock_guard<std::mutex> lock(mu);
    changes.push_back({lo, hi});
  }
  DriverModel model;
  std::mutex mu;
  std::vector<std::pair<uintptr_t, uintptr_t>> changes;
};

class SlowUnregisterDriver final : public QueuedChangesDriver {
 public:
  int Unregister(uintptr_t ptr, Context, ReleaseWait*) override {
    entered.store(true);
    while (!release.load()) std::this_thread::yield();
    done.store(true);
    return model.Unregister(ptr);
  }
  std::atomic<bool> entered{false}, release{false}, done{false};
};

TEST(PoolCopyTest, ACopyWaitsForAnEvictionOfItsMemoryInProgress) {
  SlowUnregisterDriver driver;
  FakeObserver observer;
  Pool pool(&driver, &observer, DefaultPoolLimits());
  const RegisterRequest req{kA, 4 * kPage, 0, kCtx1, 0};
  ASSERT_EQ(pool.Register(req, [&] { return driver.model.Register(kA, 4 * kPage, 0, kCtx1); }).result, 0);
  ASSERT_EQ(pool.Unregister(kA, [&] { return driver.model.Unregister(kA); }).action, Action::kDeferred);
  driver.Change(kA + kPage, kA + 2 * kPage);  // a raw munmap, say
  std::thread collector([&] { pool.ApplyPageChanges(); });
  while (!driver.entered.load()) std::this_thread::yield();
  std::atomic<bool> copied{false};
  std::thread copy([&] {
    pool.BeforeCopy(kA, kA + 4 * kPage);
    EXPECT_TRUE(driver.done.load()) << "the copy went ahead while the driver held the registration";
    copied.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(copied.load());
  driver.release.store(true);
  copy.join();
  collector.join();
  EXPECT_TRUE(copied.load());
  EXPECT_EQ(observer.evicts, std::vector<std::string>{"watch 0x100000 0"});
}

// The pages of a range leave (a raw munmap) while the driver registers it,
// and another thread's drain (the collector's) applies the watch's event
// before the entry exists: the event is noted on the call, so the entry it
// makes has left and is never deferred nor hit.
TEST(PoolCopyTest, AnUnmapAppliedWhileARegisterIsInFlightIsNotLost) {
  QueuedChangesDriver driver;
  FakeObserver observer;
  Pool pool(&driver, &observer, DefaultPoolLimits());
  const RegisterRequest req{kA, 4 * kPage, 0, kCtx1, 0};
  ASSERT_EQ(pool.Register(req, [&] {
              const int r = driver.model.Register(kA, 4 * kPage, 0, kCtx1);
              driver.Change(kA, kA + 4 * kPage);
              std::thread collector([&] { pool.ApplyPageChanges(); });
              collector.join();
              return r;
            }).result, 0);
  const Outcome un = pool.Unregister(kA, [&] { return driver.model.Unregister(kA); });
  EXPECT_EQ(un.action, Action::kPassthrough);
  EXPECT_EQ(un.reason, PassReason::kLeft);
  EXPECT_EQ(un.result, 0);
  EXPECT_EQ(driver.model.Find(kA), nullptr);
  EXPECT_FALSE(pool.TryHit(req).has_value());
}

// The same for a copy's auto-pin: the registration it made is released at once.
TEST(PoolCopyTest, AnUnmapAppliedWhileAnAutoPinIsInFlightReleasesIt) {
  QueuedChangesDriver driver;
  FakeObserver observer;
  Pool pool(&driver, &observer, DefaultPoolLimits());
  const RegisterRequest req{kA, 4 * kPage, 0, kCtx1, 0};
  const AutoPinOutcome out = pool.AutoPin(req, ~uint64_t{0}, [] { return true; }, [&] {
    const int r = driver.model.Register(kA, 4 * kPage, 0, kCtx1);
    driver.Change(kA, kA + 4 * kPage);
    std::thread collector([&] { pool.ApplyPageChanges(); });
    collector.join();
    return r;
  });
  ASSERT_EQ(out.result, AutoPinResult::kPinned);
  EXPECT_EQ(driver.model.Find(kA), nullptr);
  EXPECT_EQ(observer.evicts, std::vector<std::string>{"watch 0x100000 0"});
  EXPECT_FALSE(pool.TryHit(req).has_value());
}

// The same for an unregister the driver refuses (it keeps the registration):
// the entry put back has left, wherever in its range the change fell.
TEST(PoolCopyTest, AnUnmapAppliedWhileAFailedUnregisterIsInFlightIsNotLost) {
  for (uintptr_t changed_lo : {kA, kA + 2 * kPage}) {
    QueuedChangesDriver driver;
    FakeObserver observer;
    Pool pool(&driver, &observer, DefaultPoolLimits());
    const RegisterRequest req{kA, 4 * kPage, 0, kCtx1, 0};
    ASSERT_EQ(pool.Register(req, [&] { return driver.model.Register(kA, 4 * kPage, 0, kCtx1); })
                  .result, 0);
    const Outcome un = pool.Unregister(kA, [&] {
      driver.Change(changed_lo, kA + 4 * kPage);
      std::thread collector([&] { pool.ApplyPageChanges(); });
      collector.join();
      return 1;  // refused
    }, /*may_defer=*/false);
    ASSERT_NE(un.result, 0);
    EXPECT_FALSE(pool.TryDefer(kA).has_value()) << changed_lo - kA;
    EXPECT_FALSE(pool.TryHit(req).has_value()) << changed_lo - kA;
  }
}

// A memory hook's report (free, mprotect: MarkLeft) while the register of
// that memory is in flight: the hooks' lock-free view includes the call, and
// the entry it makes has left.
TEST(PoolCopyTest, AHookReportWhileARegisterIsInFlightMarksItsEntryLeft) {
  QueuedChangesDriver driver;
  FakeObserver observer;
  Pool pool(&driver, &observer, DefaultPoolLimits());
  const RegisterRequest req{kA, 4 * kPage, 0, kCtx1, 0};
  ASSERT_FALSE(pool.MaybeTracks(kA + kPage, kA + 2 * kPage));
  ASSERT_EQ(pool.Register(req, [&] {
              EXPECT_TRUE(pool.MaybeTracks(kA + kPage, kA + 2 * kPage));
              std::thread hook([&] { pool.MarkLeft(kA + kPage, kA + 2 * kPage); });
              hook.join();
              return driver.model.Register(kA, 4 * kPage, 0, kCtx1);
            }).result, 0);
  const Outcome un = pool.Unregister(kA, [&] { return driver.model.Unregister(kA); });
  EXPECT_EQ(un.action, Action::kPassthrough);
  EXPECT_EQ(un.reason, PassReason::kLeft);
  EXPECT_FALSE(pool.MaybeTracks(kA, kA + 4 * kPage));
}

// Reported bytes next to the call's, on a page they share (two heap blocks):
// the call's entry has not left.
TEST(PoolCopyTest, AHookReportOfNeighbouringBytesLeavesAnInFlightRegisterAlone) {
  QueuedChangesDriver driver;
  FakeObserver observer;
  Pool pool(&driver, &observer, DefaultPoolLimits());
  const RegisterRequest req{kA + 64, 4 * kPage, 0, kCtx1, 0};
  ASSERT_EQ(pool.Register(req, [&] {
              std::thread hook([&] { pool.MarkLeft(kA, kA + 64); });
              hook.join();
              return driver.model.Register(kA + 64, 4 * kPage, 0, kCtx1);
            }).result, 0);
  EXPECT_EQ(pool.Unregister(kA + 64, [&] { return driver.model.Unregister(kA + 64); }).action,
            Action::kDeferred);
}

}  // namespace lazypin
