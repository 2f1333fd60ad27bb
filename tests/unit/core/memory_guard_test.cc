// MemoryGuard (shim/core/memory_guard.h) on a pool over the fake driver: its
// contract, that memory leaving the process is invalidated before the call
// that releases it returns, that the program's own registrations there are
// marked (their unregister is the driver's), and that a thread inside
// lazypin's own code is never made to take the pool's lock.
#include "memory_guard.h"

#include <malloc.h>
#include <sys/mman.h>

#include <cstdlib>
#include <memory>

#include "fake_pool_driver.h"
#include "gtest/gtest.h"
#include "test_limits.h"
#include "thread_state.h"

namespace lazypin {
namespace {

const Context kCtx = reinterpret_cast<Context>(0x11);

class MemoryGuardTest : public ::testing::Test {
 protected:
  MemoryGuardTest()
      : pool_(&driver_, &observer_, DefaultPoolLimits()),
        guard_(&pool_, /*collector=*/nullptr) {}

  int Register(uintptr_t ptr, size_t bytes) {
    return pool_.Register(RegisterRequest{ptr, bytes, 0, kCtx, 0}, [&] {
      return driver_.model.Register(ptr, bytes, 0, kCtx);
    }).result;
  }
  Outcome Unregister(uintptr_t ptr) {
    return pool_.Unregister(ptr, [&] { return driver_.model.Unregister(ptr); });
  }
  // A registration the program made and unregistered: the pool keeps it.
  void Defer(uintptr_t ptr, size_t bytes) {
    ASSERT_EQ(Register(ptr, bytes), 0);
    ASSERT_EQ(Unregister(ptr).action, Action::kDeferred);
  }

  FakePoolDriver driver_;
  FakePoolObserver observer_;
  Pool pool_;
  MemoryGuard guard_;
};

TEST_F(MemoryGuardTest, HoldsNothingAndDoesNothingWhileThePoolIsEmpty) {
  EXPECT_FALSE(guard_.Holding());
  guard_.Leaving(0x100000, 0x200000, EvictReason::kMunmap);
  guard_.Protecting(0x100000, 0x200000, PROT_NONE);
  void* block = malloc(1 << 20);
  EXPECT_FALSE(guard_.TakeFree(block)) << "not pooled: the caller frees it";
  free(block);
  EXPECT_TRUE(driver_.log.empty());
}

TEST_F(MemoryGuardTest, MemoryLeavingIsUnregisteredBeforeTheCallReturns) {
  constexpr uintptr_t kA = 0x7f0000100000;
  Defer(kA, 1 << 20);
  EXPECT_TRUE(guard_.Holding());
  guard_.Leaving(kA + 4096, kA + 8192, EvictReason::kMunmap);  // any overlap
  ASSERT_EQ(driver_.log.size(), 1u);
  EXPECT_EQ(driver_.log[0], "evict " + Hex(kA));
  EXPECT_EQ(observer_.evicts.at(0), "munmap " + Hex(kA) + " 0");
  EXPECT_EQ(driver_.model.Unregister(kA), model::kNotRegistered) << "the driver holds nothing";
}

TEST_F(MemoryGuardTest, ProtectionTakenAwayIsMemoryLeaving) {
  constexpr uintptr_t kA = 0x7f0000100000;
  Defer(kA, 1 << 20);
  guard_.Protecting(kA, kA + 4096, PROT_READ);
  ASSERT_EQ(observer_.evicts.size(), 1u);
  EXPECT_EQ(observer_.evicts[0], "mprotect " + Hex(kA) + " 0");
}

TEST_F(MemoryGuardTest, AHeldRegistrationWhoseMemoryLeftIsUnregisteredByTheDriver) {
  constexpr uintptr_t kA = 0x7f0000100000;
  ASSERT_EQ(Register(kA, 1 << 20), 0);
  guard_.Leaving(kA, kA + (1 << 20), EvictReason::kMunmap);
  EXPECT_TRUE(driver_.log.empty()) << "the program's registration stays the program's";
  const Outcome unregister = Unregister(kA);
  EXPECT_NE(unregister.action, Action::kDeferred) << "never deferred once its memory left";
  EXPECT_EQ(unregister.result, 0);
}

TEST_F(MemoryGuardTest, AFreedBlockIsInvalidatedOnTheFreeingThreadWithoutACollector) {
  void* block = malloc(1 << 20);
  const uintptr_t lo = reinterpret_cast<uintptr_t>(block);
  Defer(lo, malloc_usable_size(block));
  EXPECT_FALSE(guard_.TakeFree(block)) << "no collector: invalidated here, the caller frees";
  EXPECT_EQ(driver_.log, std::vector<std::string>{"evict " + Hex(lo)});
  free(block);
}

TEST_F(MemoryGuardTest, InsideLazypinTheRangeIsLeftToTheKernelWatch) {
  constexpr uintptr_t kA = 0x7f0000100000;
  Defer(kA, 1 << 20);
  {
    ScopedInsideLazypin inside;  // the pool's lock may be held on this thread
    guard_.Leaving(kA, kA + 4096, EvictReason::kMunmap);
  }
  EXPECT_TRUE(driver_.log.empty());
  EXPECT_TRUE(guard_.Holding());
}

}  // namespace
}  // namespace lazypin
