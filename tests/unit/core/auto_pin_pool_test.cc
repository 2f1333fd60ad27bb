// Pool::AutoPin (LAZYPIN_AUTOPIN, shim/cuda/auto_pin.h): a copy's pageable host
// range registered by lazypin as a deferred entry, and everything the program
// does with that memory afterwards answered as if lazypin had never pinned it.
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "driver_model.h"
#include "gtest/gtest.h"
#include "pool.h"

namespace lazypin {
namespace {

using model::DriverModel;
using model::kPage;

constexpr uintptr_t kA = 0x100000;
constexpr uintptr_t kB = 0x800000;
const Context kCtx1 = reinterpret_cast<Context>(0x11);
const Context kCtx2 = reinterpret_cast<Context>(0x22);

class FakeDriver final : public PoolDriver {
 public:
  int Unregister(uintptr_t ptr, Context, ReleaseWait*) override {
    log.push_back(absl::StrFormat("evict 0x%x", ptr));
    return model.Unregister(ptr);
  }
  bool ReadFrames(uintptr_t, size_t, std::vector<uint64_t>*) override { return false; }
  int64_t NowNs() override { return now; }
  PassReason Admit(uintptr_t lo, uintptr_t hi) override {
    if (!watchable) return PassReason::kUnwatched;
    watched += 1;
    return PassReason::kNone;
  }
  void Release(uintptr_t, uintptr_t) override { watched -= 1; }
  void DrainChanges(DrainScope, absl::FunctionRef<void(uintptr_t, uintptr_t)> changed) override {
    for (auto [lo, hi] : changes) changed(lo, hi);
    changes.clear();
  }

  DriverModel model;
  std::vector<std::string> log;
  std::vector<std::pair<uintptr_t, uintptr_t>> changes;
  int64_t now = 0;
  bool watchable = true;
  int watched = 0;
};

class AutoPinPoolTest : public ::testing::Test {
 protected:
  void MakePool(PoolLimits limits) { pool_ = std::make_unique<Pool>(&driver_, nullptr, limits); }
  void SetUp() override { MakePool(DefaultPoolLimits()); }

  AutoPinOutcome Pin(uintptr_t ptr, size_t bytes, Context ctx = kCtx1, bool eligible = true,
                     uint64_t max_auto = uint64_t{1} << 40) {
    return pool_->AutoPin(
        RegisterRequest{ptr, bytes, 0, ctx, 0}, max_auto, [&] { return eligible; },
        [&] {
          driver_.log.push_back(absl::StrFormat("autopin 0x%x", ptr));
          return driver_.model.Register(ptr, bytes, 0, ctx);
        });
  }
  Outcome Reg(uintptr_t ptr, size_t bytes, unsigned flags = 0, Context ctx = kCtx1) {
    return pool_->Register(RegisterRequest{ptr, bytes, flags, ctx, 0}, [&] {
      driver_.log.push_back(absl::StrFormat("register 0x%x", ptr));
      return driver_.model.Register(ptr, bytes, flags, ctx);
    });
  }
  Outcome Unreg(uintptr_t ptr) {
    return pool_->Unregister(ptr, [&] {
      driver_.log.push_back(absl::StrFormat("unregister 0x%x", ptr));
      return driver_.model.Unregister(ptr);
    });
  }

  FakeDriver driver_;
  std::unique_ptr<Pool> pool_;
};

TEST_F(AutoPinPoolTest, PinsOnceAndLaterCopiesFindItInPlace) {
  const AutoPinOutcome first = Pin(kA, 16 * kPage);
  EXPECT_EQ(first.result, AutoPinResult::kPinned);
  EXPECT_TRUE(first.attempted);
  EXPECT_NE(driver_.model.Find(kA), nullptr);
  EXPECT_TRUE(pool_->HoldsDeferred(kA, kA + 1)) << "pageable to the program: async copies sync";
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Pin(kA, 16 * kPage).result, AutoPinResult::kCovered);
  // A copy of a part of it is covered too.
  EXPECT_EQ(Pin(kA + kPage, 2 * kPage).result, AutoPinResult::kCovered);
  const PoolCounters c = pool_->Counters();
  EXPECT_EQ(c.autopins, 1u);
  EXPECT_EQ(c.autopin_copies, 4u);
  EXPECT_EQ(c.autopinned_bytes, 16 * kPage);
  EXPECT_EQ(c.pooled_bytes, 16 * kPage);
  EXPECT_EQ(driver_.log, std::vector<std::string>{"autopin 0x100000"});
}

TEST_F(AutoPinPoolTest, TheProgramsExactRegisterIsAHitAndItsUnregisterDefers) {
  ASSERT_EQ(Pin(kA, 16 * kPage).result, AutoPinResult::kPinned);
  const Outcome hit = Reg(kA, 16 * kPage);
  EXPECT_EQ(hit.result, 0) << "not 712: the program never registered it";
  EXPECT_EQ(hit.action, Action::kHit);
  EXPECT_EQ(pool_->Counters().autopin_hits, 1u);
  EXPECT_EQ(pool_->Counters().autopinned_bytes, 0u) << "the program's now";
  EXPECT_EQ(Reg(kA, 16 * kPage).result, model::kAlreadyRegistered) << "as bare: it is registered";
  EXPECT_EQ(Unreg(kA).action, Action::kDeferred);
  EXPECT_EQ(Unreg(kA).result, model::kNotRegistered) << "a second unregister: the driver's 713";
}

TEST_F(AutoPinPoolTest, AnOverlappingRegisterUnregistersItFirstThenForwards) {
  ASSERT_EQ(Pin(kA, 16 * kPage).result, AutoPinResult::kPinned);
  const Outcome sub = Reg(kA + 2 * kPage, 4 * kPage, 1);
  EXPECT_EQ(sub.result, 0);
  EXPECT_EQ(sub.action, Action::kMiss);
  EXPECT_EQ(sub.evicted, 1);
  EXPECT_EQ(driver_.log, (std::vector<std::string>{"autopin 0x100000", "evict 0x100000",
                                                   "register 0x102000"}));
  EXPECT_EQ(pool_->Counters().autopinned_bytes, 0u);
  // Now partly the program's: a copy of the whole is left alone.
  const AutoPinOutcome copy = Pin(kA, 16 * kPage);
  EXPECT_EQ(copy.result, AutoPinResult::kSkipped);
  EXPECT_FALSE(copy.attempted);
}

TEST_F(AutoPinPoolTest, FreesAndPageChangesReleaseIt) {
  ASSERT_EQ(Pin(kA, 16 * kPage).result, AutoPinResult::kPinned);
  EXPECT_EQ(pool_->Invalidate(kA, kA + 16 * kPage, EvictReason::kMunmap), 1);
  ASSERT_EQ(Pin(kA, 16 * kPage).result, AutoPinResult::kPinned);
  // The kernel watch saw the pages go (a raw munmap): the next copy re-pins the new pages.
  driver_.changes.push_back({kA + kPage, kA + 2 * kPage});
  driver_.log.clear();
  EXPECT_EQ(Pin(kA, 16 * kPage).result, AutoPinResult::kPinned);
  EXPECT_EQ(driver_.log, (std::vector<std::string>{"evict 0x100000", "autopin 0x100000"}));
  EXPECT_EQ(pool_->ReleaseAll(EvictReason::kFork), 1);
  EXPECT_EQ(driver_.model.Find(kA), nullptr);
  EXPECT_EQ(driver_.watched, 0) << "every watched range released";
  EXPECT_EQ(pool_->Counters().autopinned_bytes, 0u);
}

TEST_F(AutoPinPoolTest, ARangeThatCopiesKeepReleasingIsNotPinnedAgain) {
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(Pin(kA, 16 * kPage).result, AutoPinResult::kPinned) << i;
    pool_->BeforeCopy(kA + 8 * kPage, kA + 24 * kPage);  // runs past it: released
    ASSERT_EQ(driver_.model.Find(kA), nullptr) << i;
  }
  EXPECT_EQ(Pin(kA, 16 * kPage).result, AutoPinResult::kSkipped);
  EXPECT_EQ(pool_->Counters().autopin_queried, 1u);
  // Other ranges, and other releases, are not affected.
  EXPECT_EQ(Pin(kB, 16 * kPage).result, AutoPinResult::kPinned);
  EXPECT_EQ(pool_->Invalidate(kB, kB + 1, EvictReason::kMunmap), 1);
  EXPECT_EQ(Pin(kB, 16 * kPage).result, AutoPinResult::kPinned);
}

// A copy whose host span the driver would take for a kept registration's
// memory but which runs past it (the driver refuses: 1; bare it is pageable)
// finds that registration released first; one inside it finds it in place;
// one over the program's own registration finds that one untouched.
TEST_F(AutoPinPoolTest, ACopyOverAKeptRangeInPartReleasesItFirst) {
  model::DriverModel bare;  // the program's view: nothing registered there
  constexpr size_t kKept = 16 * kPage - 128;  // ends inside its last page
  struct Copy {
    uintptr_t lo;
    size_t bytes;
    bool releases;
  };
  const Copy copies[] = {
      {kA + kPage, 4 * kPage, false},        // inside
      {kA, kKept, false},                    // exactly
      {kA, 32 * kPage, true},                // starts inside, runs past
      {kA + 8 * kPage, 16 * kPage, true},    // starts later inside, runs past
      {kA - 4 * kPage, 8 * kPage, true},     // ends inside
      {kA - 4 * kPage, 24 * kPage, true},    // covers it
      {kA + kKept + 64, 32, true},           // its last page, past its bytes
  };
  uintptr_t kept = kA;  // each copy over a range of its own
  for (const Copy& c : copies) {
    SCOPED_TRACE(absl::StrFormat("copy at kept%+d, %d bytes", int64_t(c.lo - kA), c.bytes));
    kept += 64 * kPage;
    ASSERT_EQ(Pin(kept, kKept).result, AutoPinResult::kPinned);
    const uintptr_t lo = kept + (c.lo - kA), hi = lo + c.bytes;
    ASSERT_TRUE(pool_->MaybeHolds(lo, hi));
    pool_->BeforeCopy(lo, hi);
    EXPECT_EQ(driver_.model.Find(kept) == nullptr, c.releases);
    EXPECT_EQ(driver_.model.Copy(lo, hi), bare.Copy(lo, hi));
    // Released, what the copy touches is memory nobody holds: it may be pinned.
    if (c.releases) {
      EXPECT_EQ(driver_.log.back(), absl::StrFormat("evict 0x%x", kept));
      EXPECT_EQ(Pin(lo, c.bytes).result, AutoPinResult::kPinned);
    }
  }
  EXPECT_EQ(pool_->Counters().evictions[static_cast<int>(EvictReason::kOverlap)], 5u);
  // The program's registration, starting where the copy starts: the driver
  // answers as bare, and nothing of the program's is released.
  ASSERT_EQ(Reg(kB, 4 * kPage).result, 0);
  bare.Register(kB, 4 * kPage, 0, kCtx1);
  pool_->BeforeCopy(kB, kB + 8 * kPage);
  EXPECT_NE(driver_.model.Find(kB), nullptr);
  EXPECT_EQ(driver_.model.Copy(kB, kB + 8 * kPage), bare.Copy(kB, kB + 8 * kPage));
  EXPECT_EQ(bare.Copy(kB, kB + 8 * kPage), model::kInvalidValue);
}

// Two overlapping ranges copied in turn: each copy releases the other's pin.
// A range released so twice is not pinned again, so the unregisters stop.
TEST_F(AutoPinPoolTest, RangesThatCopiesKeepReleasingAreNotPinnedAgain) {
  const uintptr_t kA2 = kA + 8 * kPage;
  int pins = 0;
  for (int i = 0; i < 6; ++i) {
    for (uintptr_t lo : {kA, kA2}) {
      pool_->BeforeCopy(lo, lo + 16 * kPage);
      pins += Pin(lo, 16 * kPage).result == AutoPinResult::kPinned ? 1 : 0;
    }
  }
  EXPECT_EQ(pins, 4) << "each range pinned and released twice, then left pageable";
  EXPECT_EQ(pool_->Counters().evictions[static_cast<int>(EvictReason::kOverlap)], 4u);
  EXPECT_GT(pool_->Counters().autopin_queried, 0u);
}

TEST_F(AutoPinPoolTest, IdleCollectionReleasesItAndCopiesKeepItAlive) {
  ASSERT_EQ(Pin(kA, 16 * kPage).result, AutoPinResult::kPinned);
  ASSERT_EQ(Pin(kB, 16 * kPage).result, AutoPinResult::kPinned);
  driver_.now = 100;
  EXPECT_EQ(Pin(kA, 16 * kPage).result, AutoPinResult::kCovered);  // kA used at 100
  driver_.now = 150;
  EXPECT_EQ(pool_->CollectIdle(100), 1) << "kB idle since 0, kA used at 100";
  EXPECT_EQ(driver_.model.Find(kB), nullptr);
  EXPECT_NE(driver_.model.Find(kA), nullptr);
}

TEST_F(AutoPinPoolTest, BoundsAreNeverExceededAndNothingIsEvictedForIt) {
  PoolLimits limits = DefaultPoolLimits();
  limits.max_bytes = 24 * kPage;
  MakePool(limits);
  ASSERT_EQ(Reg(kB, 16 * kPage).result, 0);
  ASSERT_EQ(Unreg(kB).action, Action::kDeferred);  // the program's deferred entry
  EXPECT_EQ(Pin(kA, 16 * kPage).result, AutoPinResult::kSkipped) << "would pass max_bytes";
  EXPECT_NE(driver_.model.Find(kB), nullptr) << "the program's deferred entry stays";
  EXPECT_EQ(Pin(kA, 8 * kPage).result, AutoPinResult::kPinned);
  // Its own bound.
  EXPECT_EQ(Pin(kA + 64 * kPage, 8 * kPage, kCtx1, true, 8 * kPage).result, AutoPinResult::kSkipped);
  EXPECT_EQ(pool_->Counters().autopin_full, 2u);
}

TEST_F(AutoPinPoolTest, IneligibleUnwatchableOtherContextOrRefusedIsLeftAlone) {
  EXPECT_EQ(Pin(kA, 16 * kPage, kCtx1, /*eligible=*/false).result, AutoPinResult::kSkipped);
  driver_.watchable = false;
  EXPECT_EQ(Pin(kA, 16 * kPage).result, AutoPinResult::kSkipped);
  driver_.watchable = true;
  EXPECT_EQ(driver_.model.Find(kA), nullptr);
  // Registered behind the pool's back (another library): the driver refuses, nothing kept.
  ASSERT_EQ(driver_.model.Register(kA, 16 * kPage, 0, kCtx1), 0);
  const AutoPinOutcome refused = Pin(kA, 16 * kPage);
  EXPECT_EQ(refused.result, AutoPinResult::kSkipped);
  EXPECT_EQ(refused.driver_result, model::kAlreadyRegistered);
  EXPECT_EQ(driver_.watched, 0);
  EXPECT_EQ(driver_.model.Unregister(kA), 0);
  // A refused range is not asked again for every copy of it.
  EXPECT_FALSE(Pin(kA, 16 * kPage).attempted);
  EXPECT_TRUE(Pin(kA, 12 * kPage).attempted) << "another range";
  ASSERT_EQ(pool_->Invalidate(kA, kA + 1, EvictReason::kMunmap), 1);
  // Pinned in one context: a copy in another context neither counts nor pins over it.
  ASSERT_EQ(Pin(kA, 12 * kPage, kCtx1).result, AutoPinResult::kPinned);
  EXPECT_EQ(Pin(kA, 12 * kPage, kCtx2).result, AutoPinResult::kSkipped);
  // The program's in-use registration of any part of it: left alone.
  ASSERT_EQ(Reg(kB, 4 * kPage).result, 0);
  EXPECT_EQ(Pin(kB - kPage, 16 * kPage).result, AutoPinResult::kSkipped);
  EXPECT_EQ(pool_->Counters().autopins, 2u) << "the 12-page range, twice";
}

TEST_F(AutoPinPoolTest, AContextTeardownReleasesIt) {
  ASSERT_EQ(Pin(kA, 16 * kPage, kCtx2).result, AutoPinResult::kPinned);
  EXPECT_EQ(pool_->DropContext(kCtx2), 1);
  EXPECT_EQ(driver_.model.Find(kA), nullptr);
}

TEST_F(AutoPinPoolTest, AForkChildPoolNeverPins) {
  pool_->AbandonAfterFork();
  EXPECT_EQ(Pin(kA, 16 * kPage).result, AutoPinResult::kSkipped);
  EXPECT_TRUE(driver_.log.empty());
}

}  // namespace
}  // namespace lazypin
