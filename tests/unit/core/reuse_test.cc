// Freed blocks that come back (LAZYPIN_REUSE_FREED): glibc's fresh block
// sizes (shim/core/glibc_blocks), the park index (shim/core/park_index.h) and the
// pool's rules for parking (Pool::Park / Unpark), against a driver model.
#include <malloc.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "driver_model.h"
#include "glibc_blocks.h"
#include "gtest/gtest.h"
#include "park_index.h"
#include "pool.h"

namespace lazypin {
namespace {

using model::DriverModel;
using model::kPage;

bool Predicted(const FreshSizes& f, size_t usable) {
  for (int i = 0; i < f.count; ++i) {
    if (f.usable[i] == usable) return true;
  }
  return false;
}

// The prediction must hold for the glibc this runs on, whichever way its
// dynamic mmap threshold has moved (each free of an mmapped chunk raises it).
TEST(GlibcFreshUsable, CoversWhatThisGlibcReturns) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t sizes[] = {1,       24,          100,         4096,          65536,
                          131000,  131072,      1 << 20,     (4 << 20) - 1, 4 << 20,
                          (4 << 20) + 1, 16 << 20, 40 << 20, 100 << 20};
  for (int round = 0; round < 3; ++round) {
    for (size_t n : sizes) {
      void* p = malloc(n);
      ASSERT_NE(p, nullptr);
      EXPECT_TRUE(Predicted(GlibcFreshUsable(n, 0, page), malloc_usable_size(p)))
          << "malloc(" << n << ") usable " << malloc_usable_size(p) << " round " << round;
      void* c = calloc(1, n);
      EXPECT_TRUE(Predicted(GlibcFreshUsable(n, 0, page), malloc_usable_size(c))) << "calloc " << n;
      for (size_t align : {size_t{64}, size_t{4096}}) {
        void* a = nullptr;
        ASSERT_EQ(posix_memalign(&a, align, n), 0);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % align, 0u);
        EXPECT_TRUE(Predicted(GlibcFreshUsable(n, align, page), malloc_usable_size(a)))
            << "posix_memalign(" << align << ", " << n << ") usable " << malloc_usable_size(a);
        free(a);
      }
      free(c);
      free(p);
    }
  }
}

TEST(GlibcFreshUsable, RefusesWhatGlibcRefuses) {
  EXPECT_EQ(GlibcFreshUsable(~size_t{0} - 10, 0, 4096).count, 0);
}

TEST(GlibcChunkOf, ReadsWhatMallocUsableSizeGivesAndRejectsInteriorPointers) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  for (size_t n : {size_t{24}, size_t{4000}, size_t{100000}, size_t{1} << 20, size_t{5} << 20}) {
    void* p = malloc(n);
    const GlibcChunk c = GlibcChunkOf(p, page);
    EXPECT_EQ(c.usable, malloc_usable_size(p)) << n;
    EXPECT_TRUE(c.servable) << n;
    if (c.mmapped) {
      EXPECT_EQ((c.usable + 16) % page, 0u) << n;  // a mapping of whole pages
    }
    free(p);
  }
  void* aligned = memalign(page, size_t{1} << 20);
  EXPECT_EQ(GlibcChunkOf(aligned, page).usable, malloc_usable_size(aligned));
  EXPECT_TRUE(GlibcChunkOf(aligned, page).servable) << "a page's lead";
  free(aligned);
  // An alignment above a page: a lead of k pages less 16, which only the
  // first k looks like a page's.
  void* big = memalign(size_t{2} << 20, size_t{1} << 20);
  const GlibcChunk b = GlibcChunkOf(big, page);
  EXPECT_EQ(b.usable, malloc_usable_size(big));
  if (b.mmapped) {  // else from the heap: the 5 MiB free above raised the threshold
    size_t lead;
    // The chunk header before the block (glibc's layout, read as GlibcChunkOf does).
    const uintptr_t header = reinterpret_cast<uintptr_t>(big) - 16;
    memcpy(&lead, reinterpret_cast<const void*>(header), sizeof lead);
    EXPECT_EQ(b.servable, lead == page - 16) << lead;
  }
  free(big);
  // free(p + 8192) of a zeroed block: a size of 0, which glibc rejects.
  auto* z = static_cast<char*>(calloc(1, size_t{1} << 20));
  EXPECT_EQ(GlibcChunkOf(z + 8192, page).usable, 0u);
  memset(z + 8192 - 8, 0x41, 8);  // a size glibc cannot take either
  EXPECT_EQ(GlibcChunkOf(z + 8192, page).usable, 0u);
  free(z);
}

TEST(GlibcFreshUsable, FollowsTheMmapFloor) {
  const FreshSizes dynamic = GlibcFreshUsable(size_t{1} << 20, 0, 4096);
  const FreshSizes raised = GlibcFreshUsable(size_t{1} << 20, 0, 4096, size_t{32} << 20);
  EXPECT_EQ(dynamic.count, raised.count + 1) << "the mmapped size only at or above the floor";
  EXPECT_EQ(GlibcFreshUsable(size_t{1} << 20, 0, 4096, kGlibcNoMmap).count, raised.count);
}

TEST(ParkIndex, TakesBySizeThenAlignment) {
  ParkIndex index;
  index.Add(0x10010, 4198384);  // malloc'd, mmapped: 16 past a page
  index.Add(0x20000, 4198384);  // page aligned
  index.Add(0x30010, 1000);
  const size_t want[] = {4194312, 4198384};
  EXPECT_EQ(index.Take(want, 2, 4096), 0x20000u) << "the aligned one";
  EXPECT_EQ(index.Take(want, 2, 4096), 0u) << "no other aligned block";
  EXPECT_EQ(index.Take(want, 2, 0), 0x10010u);
  EXPECT_EQ(index.Take(want, 2, 0), 0u);
  const size_t other[] = {999};
  EXPECT_EQ(index.Take(other, 1, 0), 0u) << "a usable size must be equal, not merely enough";
  EXPECT_TRUE(index.Remove(0x30010, 1000));
  EXPECT_FALSE(index.Remove(0x30010, 1000));
  EXPECT_TRUE(index.empty());
}

TEST(ParkIndex, NamesTheBlocksToZeroUntilZeroedOrGone) {
  ParkIndex index;
  size_t usable = 0;
  index.Add(0x10010, 4198384, /*zero_ahead=*/false);
  EXPECT_EQ(index.NextToZero(&usable), 0u) << "a heap chunk is served as it is";
  index.Add(0x20010, 4198384, /*zero_ahead=*/true);
  index.Add(0x30010, 8392688, /*zero_ahead=*/true);
  const uintptr_t first = index.NextToZero(&usable);
  ASSERT_TRUE(first == 0x20010u || first == 0x30010u);
  index.MarkZeroed(first, usable);
  const uintptr_t second = index.NextToZero(&usable);
  EXPECT_EQ(second, first == 0x20010u ? 0x30010u : 0x20010u);
  EXPECT_TRUE(index.Remove(second, usable));
  EXPECT_EQ(index.NextToZero(&usable), 0u) << "one zeroed, one gone";
  const size_t want[] = {4198384};
  bool zeroed = false;
  const uintptr_t taken = index.Take(want, 1, 0, &zeroed);
  EXPECT_EQ(zeroed, taken == first) << "only the block marked zeroed says so";
}

TEST(ParkIndex, FullRefusesAndFreedSlotsAreReused) {
  ParkIndex index;
  for (int i = 0; i < ParkIndex::kCapacity; ++i) {
    ASSERT_TRUE(index.Add(0x1000 * (i + 1), 64 + 16 * (i % 7)));
  }
  EXPECT_FALSE(index.Add(0x99990000, 64)) << "full: not parked";
  const size_t want[] = {64 + 16 * 3};
  const uintptr_t got = index.Take(want, 1, 0);
  EXPECT_NE(got, 0u);
  EXPECT_TRUE(index.Add(0x99990000, 64)) << "a slot again";
  EXPECT_EQ(index.size(), ParkIndex::kCapacity);
  for (int i = 0; i < ParkIndex::kCapacity; ++i) {
    const uintptr_t block = 0x1000 * (i + 1);
    if (block != got) {
      EXPECT_TRUE(index.Remove(block, 64 + 16 * (i % 7))) << i;
    }
  }
  EXPECT_TRUE(index.Remove(0x99990000, 64));
  EXPECT_TRUE(index.empty());
}

class FakeDriver final : public PoolDriver {
 public:
  int Unregister(uintptr_t ptr, Context, ReleaseWait*) override {
    log.push_back(absl::StrFormat("unregister 0x%x", ptr));
    return model.Unregister(ptr);
  }
  bool ReadFrames(uintptr_t, size_t, std::vector<uint64_t>*) override { return false; }
  int64_t NowNs() override { return now; }
  DriverModel model;
  std::vector<std::string> log;
  int64_t now = 0;
};

std::vector<std::string>* g_log = nullptr;
void RecordFree(void* block) {
  g_log->push_back(absl::StrFormat("free 0x%x", reinterpret_cast<uintptr_t>(block)));
}

constexpr uintptr_t kA = 0x100010;  // a malloc'd block: 16 bytes past a page
constexpr uintptr_t kB = 0x900010;
constexpr size_t kBytes = 4 << 20;
const size_t kUsable = GlibcFreshUsable(kBytes, 0, 4096).usable[2];  // the mmapped one
const Context kCtx = reinterpret_cast<Context>(0x11);

class ReusePoolTest : public ::testing::Test {
 protected:
  void SetUp() override { Make(DefaultPoolLimits()); }
  void Make(PoolLimits limits) {
    pool_ = std::make_unique<Pool>(&driver_, nullptr, limits);
    g_log = &driver_.log;
    pool_->EnableReuse(ReuseHooks{&RecordFree, &gauge_});
  }
  Outcome Reg(uintptr_t ptr, size_t bytes) {
    return pool_->Register(RegisterRequest{ptr, bytes, 0, kCtx, 0}, [&] {
      driver_.log.push_back(absl::StrFormat("register 0x%x", ptr));
      return driver_.model.Register(ptr, bytes, 0, kCtx);
    });
  }
  Outcome Unreg(uintptr_t ptr) {
    return pool_->Unregister(ptr, [&] { return driver_.model.Unregister(ptr); });
  }
  void DeferAndPark(uintptr_t ptr) {
    ASSERT_EQ(Reg(ptr, kBytes).action, Action::kMiss);
    ASSERT_EQ(Unreg(ptr).action, Action::kDeferred);
    ASSERT_TRUE(pool_->Park(ptr, kUsable));
  }
  FreshSizes Fresh(size_t bytes = kBytes) { return GlibcFreshUsable(bytes, 0, 4096); }

  FakeDriver driver_;
  std::atomic<int64_t> gauge_{0};
  std::unique_ptr<Pool> pool_;
};

TEST_F(ReusePoolTest, ParkedBlockComesBackAndItsRegisterIsAHit) {
  DeferAndPark(kA);
  EXPECT_EQ(gauge_.load(), 1);
  EXPECT_TRUE(pool_->MaybeParked(Fresh()));
  EXPECT_EQ(pool_->Unpark(Fresh(100), 0), 0u) << "another size class";
  EXPECT_EQ(pool_->Unpark(Fresh(), 4096), 0u) << "not page aligned";
  EXPECT_EQ(pool_->Unpark(Fresh(), 0), kA);
  EXPECT_EQ(gauge_.load(), 0);
  EXPECT_EQ(pool_->Unpark(Fresh(), 0), 0u) << "served once";
  driver_.log.clear();
  const Outcome hit = Reg(kA, kBytes);
  EXPECT_EQ(hit.action, Action::kHit);
  EXPECT_TRUE(driver_.log.empty()) << "no driver call, no free";
  const PoolCounters c = pool_->Counters();
  EXPECT_EQ(c.parked, 1u);
  EXPECT_EQ(c.served, 1u);
  EXPECT_EQ(c.parked_now, 0u);
}

TEST_F(ReusePoolTest, ServedBlockStaysDeferredUntilRegistered) {
  DeferAndPark(kA);
  ASSERT_EQ(pool_->Unpark(Fresh(), 0), kA);
  // Pinned memory the program believes pageable: the copy guard's test still says so.
  EXPECT_TRUE(pool_->MaybeHolds(kA, kA + 1));
  EXPECT_TRUE(pool_->HoldsDeferred(kA, kA + 1));
  // Freed again without registering: parked again.
  EXPECT_TRUE(pool_->Park(kA, kUsable));
}

TEST_F(ReusePoolTest, ParksOnlyAWholeDeferredEntryBasedAtTheBlock) {
  ASSERT_EQ(Reg(kA, kBytes).action, Action::kMiss);
  EXPECT_FALSE(pool_->Park(kA, kUsable)) << "in use: the program still holds it";
  ASSERT_EQ(Unreg(kA).action, Action::kDeferred);
  EXPECT_FALSE(pool_->Park(kA - 16, kUsable + 16)) << "an entry not based at the block";
  EXPECT_FALSE(pool_->Park(kA, kBytes - 1)) << "an entry longer than the block";
  EXPECT_TRUE(pool_->Park(kA, kUsable));
  EXPECT_FALSE(pool_->Park(kA, kUsable)) << "already parked";
  Pool off(&driver_, nullptr, DefaultPoolLimits());
  EXPECT_FALSE(off.Park(kA, kUsable)) << "reuse not enabled";
}

TEST_F(ReusePoolTest, ReleasedParkedBlockIsUnregisteredThenFreed) {
  DeferAndPark(kA);
  driver_.log.clear();
  driver_.now = 20;
  EXPECT_EQ(pool_->CollectIdle(10), 1);
  EXPECT_EQ(driver_.log, (std::vector<std::string>{"unregister 0x100010", "free 0x100010"}));
  EXPECT_EQ(gauge_.load(), 0);
  EXPECT_EQ(pool_->Unpark(Fresh(), 0), 0u);
  EXPECT_EQ(pool_->Counters().pooled_entries, 0u);
}

TEST_F(ReusePoolTest, BoundsCountParkedBlocks) {
  PoolLimits limits = DefaultPoolLimits();
  limits.max_entries = 1;
  Make(limits);
  DeferAndPark(kA);
  driver_.log.clear();
  ASSERT_EQ(Reg(kB, kBytes).action, Action::kMiss);
  ASSERT_EQ(Unreg(kB).action, Action::kDeferred);  // over the bound: the oldest goes
  EXPECT_EQ(driver_.log,
            (std::vector<std::string>{"register 0x900010", "unregister 0x100010", "free 0x100010"}));
  EXPECT_EQ(gauge_.load(), 0);
}

TEST_F(ReusePoolTest, ParksWithinTheByteBound) {
  pool_ = std::make_unique<Pool>(&driver_, nullptr, DefaultPoolLimits());
  pool_->EnableReuse(ReuseHooks{&RecordFree, &gauge_, kUsable + kUsable / 2});
  DeferAndPark(kA);
  ASSERT_EQ(Reg(kB, kBytes).action, Action::kMiss);
  ASSERT_EQ(Unreg(kB).action, Action::kDeferred);
  EXPECT_FALSE(pool_->Park(kB, kUsable)) << "past the bound: released as before";
  ASSERT_EQ(pool_->Unpark(Fresh(), 0), kA);
  EXPECT_TRUE(pool_->Park(kB, kUsable)) << "room again";
  EXPECT_EQ(pool_->Counters().parked_bytes, kUsable);
}

TEST_F(ReusePoolTest, RegisterOfAParkedBlockIsNoHit) {
  // Registering memory the program freed is the driver's affair: the parked
  // block is released (unregistered, then freed), then the call forwarded.
  DeferAndPark(kA);
  driver_.log.clear();
  const Outcome out = Reg(kA, kBytes);
  EXPECT_EQ(out.action, Action::kMiss);
  EXPECT_EQ(driver_.log, (std::vector<std::string>{"unregister 0x100010", "free 0x100010",
                                                   "register 0x100010"}));
}

TEST_F(ReusePoolTest, InvalidatedParkedBlockIsFreedAfterTheUnregister) {
  DeferAndPark(kA);
  driver_.log.clear();
  EXPECT_EQ(pool_->ReleaseAll(EvictReason::kFork), 1);
  EXPECT_EQ(driver_.log, (std::vector<std::string>{"unregister 0x100010", "free 0x100010"}));
}

TEST_F(ReusePoolTest, ReleaseParkedForAnAllocationThatFailed) {
  DeferAndPark(kA);
  ASSERT_EQ(Reg(kB, kBytes).action, Action::kMiss);
  ASSERT_EQ(Unreg(kB).action, Action::kDeferred);  // deferred, not parked: stays
  driver_.log.clear();
  EXPECT_EQ(pool_->ReleaseParked(EvictReason::kMakeRoom), 1);
  EXPECT_EQ(driver_.log, (std::vector<std::string>{"unregister 0x100010", "free 0x100010"}));
  EXPECT_EQ(gauge_.load(), 0);
  EXPECT_EQ(pool_->Counters().pooled_entries, 1u);
}

TEST_F(ReusePoolTest, ReleaseParkedInARangeAndHoldsParked) {
  DeferAndPark(kA);
  ASSERT_EQ(Reg(kB, kBytes).action, Action::kMiss);
  ASSERT_EQ(Unreg(kB).action, Action::kDeferred);
  ASSERT_TRUE(pool_->Park(kB, kUsable));
  EXPECT_TRUE(pool_->HoldsParked(kA));
  EXPECT_FALSE(pool_->HoldsParked(kA + 16));
  driver_.log.clear();
  EXPECT_EQ(pool_->ReleaseParked(EvictReason::kMmapFixed, kB + 4096, kB + 8192), 1);
  EXPECT_EQ(driver_.log, (std::vector<std::string>{"unregister 0x900010", "free 0x900010"}));
  EXPECT_TRUE(pool_->HoldsParked(kA));
  EXPECT_FALSE(pool_->HoldsParked(kB));
}

TEST_F(ReusePoolTest, YieldWatchReleasesDeferredAndPassesInUseThrough) {
  DeferAndPark(kA);
  ASSERT_EQ(Reg(kB, kBytes).action, Action::kMiss);
  driver_.log.clear();
  EXPECT_EQ(pool_->YieldWatch(kA, kB + kBytes, EvictReason::kUserfaultfd), 2);
  EXPECT_EQ(driver_.log, (std::vector<std::string>{"unregister 0x100010", "free 0x100010"}));
  // The in-use one is no longer watched: its unregister is the driver's.
  EXPECT_EQ(Unreg(kB).action, Action::kPassthrough);
  EXPECT_EQ(pool_->Counters().pooled_entries, 0u);
}

TEST_F(ReusePoolTest, ForkChildNeverServes) {
  DeferAndPark(kA);
  pool_->AbandonAfterFork();
  EXPECT_EQ(gauge_.load(), 0);
  EXPECT_EQ(pool_->Unpark(Fresh(), 0), 0u);
}

// Zeroing ahead (Pool::ZeroParkedStep) writes into the block: a real mapping
// stands for the mmapped chunk, the block 16 bytes into it.
class ZeroAheadTest : public ReusePoolTest {
 protected:
  void SetUp() override {
    ReusePoolTest::SetUp();
    map_bytes_ = kUsable + 16;
    map_ = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(map_, MAP_FAILED);
    block_ = reinterpret_cast<uintptr_t>(map_) + 16;
    Fill(0xab);
  }
  void TearDown() override { munmap(map_, map_bytes_); }
  void Fill(unsigned char c) { memset(reinterpret_cast<void*>(block_), c, kUsable); }
  size_t CountOf(unsigned char c) const {
    const auto* p = reinterpret_cast<const unsigned char*>(block_);
    size_t n = 0;
    for (size_t i = 0; i < kUsable; ++i) n += p[i] == c;
    return n;
  }
  void DeferAndParkAhead() {
    ASSERT_EQ(Reg(block_, kBytes).action, Action::kMiss);
    ASSERT_EQ(Unreg(block_).action, Action::kDeferred);
    ASSERT_TRUE(pool_->Park(block_, kUsable, /*zero_ahead=*/true));
  }
  size_t ZeroAll() {
    size_t steps = 0;
    while (pool_->ZeroParkedStep(kStep) != 0) ++steps;
    return steps;
  }
  static constexpr size_t kStep = 256 << 10;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  uintptr_t block_ = 0;
};

TEST_F(ZeroAheadTest, ServedBlockWasZeroedInSteps) {
  DeferAndParkAhead();
  EXPECT_EQ(ZeroAll(), (kUsable + kStep - 1) / kStep) << "one step per 256 KiB, then nothing";
  EXPECT_EQ(CountOf(0), kUsable);
  bool zeroed = false;
  EXPECT_EQ(pool_->Unpark(Fresh(), 0, &zeroed), block_);
  EXPECT_TRUE(zeroed);
  EXPECT_EQ(Reg(block_, kBytes).action, Action::kHit) << "zeroing keeps the registration";
}

TEST_F(ZeroAheadTest, OnlyBlocksParkedToBeZeroed) {
  ASSERT_EQ(Reg(block_, kBytes).action, Action::kMiss);
  ASSERT_EQ(Unreg(block_).action, Action::kDeferred);
  ASSERT_TRUE(pool_->Park(block_, kUsable));  // a heap chunk: served as it is, unless calloc's
  EXPECT_EQ(pool_->ZeroParkedStep(kStep), 0u);
  bool zeroed = true;
  EXPECT_EQ(pool_->Unpark(Fresh(), 0, &zeroed), block_);
  EXPECT_FALSE(zeroed);
  EXPECT_EQ(CountOf(0xab), kUsable) << "untouched";
}

TEST_F(ZeroAheadTest, BlockServedMidwayIsNotWrittenAgainNorSaidZeroed) {
  DeferAndParkAhead();
  ASSERT_EQ(pool_->ZeroParkedStep(kStep), kStep);
  bool zeroed = true;
  ASSERT_EQ(pool_->Unpark(Fresh(), 0, &zeroed), block_) << "served, not held back for its zeroing";
  EXPECT_FALSE(zeroed) << "the caller zeroes it";
  Fill(0xcd);  // the program's bytes
  EXPECT_EQ(pool_->ZeroParkedStep(kStep), 0u);
  EXPECT_EQ(CountOf(0xcd), kUsable) << "no write after it left the park";
}

TEST_F(ZeroAheadTest, ReleasedMidwayThenParkedAgainIsZeroedFromTheStart) {
  DeferAndParkAhead();
  ASSERT_EQ(pool_->ZeroParkedStep(kStep), kStep);
  driver_.log.clear();
  ASSERT_EQ(pool_->ReleaseParked(EvictReason::kMakeRoom), 1);
  EXPECT_EQ(driver_.log, (std::vector<std::string>{absl::StrFormat("unregister 0x%x", block_),
                                                   absl::StrFormat("free 0x%x", block_)}));
  // The allocator gives the same block to the program again, which writes,
  // registers, unregisters and frees it.
  Fill(0xcd);
  DeferAndParkAhead();
  // The cancelled round ends without a write; the step goes on with the block
  // parked now, from its start.
  EXPECT_EQ(pool_->ZeroParkedStep(kStep), kStep);
  EXPECT_EQ(CountOf(0xcd), kUsable - kStep);
  EXPECT_EQ(ZeroAll(), (kUsable + kStep - 1) / kStep - 1);
  bool zeroed = false;
  EXPECT_EQ(pool_->Unpark(Fresh(), 0, &zeroed), block_);
  EXPECT_TRUE(zeroed);
  EXPECT_EQ(CountOf(0), kUsable);
}

// A release racing the zeroing thread: the free never comes while a step
// writes into the block (the free hook here checks the bytes it is handed
// are not written after, by writing them itself and reading them back).
TEST_F(ZeroAheadTest, FreeNeverOverlapsAWrite) {
  static std::atomic<int> overwritten{0};
  static uintptr_t block = 0;
  static size_t usable = 0;
  block = block_;
  usable = kUsable;
  pool_->EnableReuse(ReuseHooks{+[](void* b) {
                                  auto* p = static_cast<unsigned char*>(b);
                                  memset(p, 0xee, usable);
                                  for (int spin = 0; spin < 2000; ++spin) asm volatile("" ::: "memory");
                                  for (size_t i = 0; i < usable; i += 4096) overwritten += p[i] != 0xee;
                                },
                                &gauge_});
  std::atomic<bool> stop{false};
  std::thread zeroing([&] {
    while (!stop.load()) pool_->ZeroParkedStep(kStep);
  });
  for (int round = 0; round < 1000; ++round) {
    DeferAndParkAhead();
    for (int spin = 0; spin < (round % 100) * 50; ++spin) asm volatile("" ::: "memory");
    ASSERT_EQ(pool_->ReleaseParked(EvictReason::kMakeRoom), 1);
  }
  stop = true;
  zeroing.join();
  EXPECT_EQ(overwritten.load(), 0);
  (void)block;
}

}  // namespace
}  // namespace lazypin
