// AutoPin (cuda/auto_pin.h), the copy side of auto-pin: the threshold that
// keeps small copies off its path, the copy timing that prices its saving,
// and, on the simulated driver, a pageable range pinned at the copy
// LAZYPIN_AUTOPIN_AFTER names and covered at the next ones.
#include "auto_pin.h"

#include <sys/mman.h>

#include <cstring>
#include <memory>
#include <vector>

#include "cuda_pool_driver.h"
#include "gtest/gtest.h"
#include "sim_driver.h"
#include "test_limits.h"

namespace lazypin {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

class Records final : public AutoPinSink {
 public:
  void RecordAutoPin(const AutoPinRecord& record) override { records.push_back(record); }
  void OnFirstCopy() override { ++first_copies; }
  std::vector<AutoPinRecord> records;
  int first_copies = 0;
};

TEST(AutoPinTest, ACopyBelowTheThresholdAsksNothing) {
  // No pool, no environment: a copy below min_bytes must not reach either.
  AutoPin auto_pin(nullptr, nullptr, nullptr, AutoPinLimits{kMiB, 64 * kMiB, 1});
  char buffer[4096];
  const AutoPinCopy copy =
      auto_pin.BeforeCopy("cuMemcpyHtoD_v2", Via::kSymbol, CopySide{}, HostSide(buffer, sizeof buffer));
  EXPECT_EQ(copy.rate, CopyRate::kNone);
  EXPECT_EQ(auto_pin.min_bytes(), kMiB);
}

TEST(AutoPinTest, CopyTimingIsSummedPerDirectionAndRate) {
  AutoPin auto_pin(nullptr, nullptr, nullptr, AutoPinLimits{kMiB, 64 * kMiB, 1});
  auto_pin.CopyTimed(AutoPinCopy{CopyRate::kPinned, true, 4 * kMiB}, 100);
  auto_pin.CopyTimed(AutoPinCopy{CopyRate::kPinned, true, 2 * kMiB}, 50);
  auto_pin.CopyTimed(AutoPinCopy{CopyRate::kPageable, false, kMiB}, 70);
  auto_pin.CopyTimed(AutoPinCopy{CopyRate::kNone, false, kMiB}, 1000);  // not auto-pin's: ignored
  const AutoPinCopyStats stats = auto_pin.CopyStats();
  EXPECT_EQ(stats.dir[0].pinned.copies, 2u);
  EXPECT_EQ(stats.dir[0].pinned.bytes, 6 * kMiB);
  EXPECT_EQ(stats.dir[0].pinned.ns, 150);
  EXPECT_EQ(stats.dir[0].pageable.copies, 0u);
  EXPECT_EQ(stats.dir[1].pageable.copies, 1u);
  EXPECT_EQ(stats.dir[1].pageable.bytes, kMiB);
  EXPECT_EQ(stats.dir[1].pageable.ns, 70);
  EXPECT_EQ(stats.dir[1].pinned.copies, 0u);
}

class AutoPinSimTest : public sim_driver::SimDriverTest {
 protected:
  void SetUp() override {
    SimDriverTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    driver_ = MakeCudaPoolDriver(nullptr, /*defer_shared=*/true, /*prefault_threads=*/0);
    pool_ = std::make_unique<Pool>(driver_.get(), nullptr, DefaultPoolLimits());
    void* p = mmap(nullptr, 2 * kMiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    memset(p, 1, 2 * kMiB);
    range_ = static_cast<char*>(p);
  }
  void TearDown() override {
    if (pool_ != nullptr) pool_->ReleaseAll(EvictReason::kExit);
    if (range_ != nullptr) munmap(range_, 2 * kMiB);
    SimDriverTest::TearDown();
  }
  // A host-to-device copy of the whole range (the device side: null).
  AutoPinCopy CopyToDevice(AutoPin& auto_pin) {
    return auto_pin.BeforeCopy("cuMemcpyHtoD_v2", Via::kSymbol, CopySide{},
                               HostSide(range_, 2 * kMiB));
  }

  sim_driver::Env env_;
  std::unique_ptr<PoolDriver> driver_;
  std::unique_ptr<Pool> pool_;
  char* range_ = nullptr;
  Records sink_;
};

TEST_F(AutoPinSimTest, ARangeIsPinnedAtItsAfterthCopyAndCoveredAtTheNext) {
  AutoPin auto_pin(pool_.get(), &env_, &sink_, AutoPinLimits{64 << 10, 64 * kMiB, 2});
  const unsigned long registered_before = sim_->live_registrations();
  const AutoPinCopy first = CopyToDevice(auto_pin);
  EXPECT_EQ(first.rate, CopyRate::kPageable);  // counted, left pageable
  EXPECT_TRUE(first.to_device);
  EXPECT_EQ(first.bytes, 2 * kMiB);
  EXPECT_TRUE(sink_.records.empty());
  EXPECT_EQ(sink_.first_copies, 1);

  const AutoPinCopy second = CopyToDevice(auto_pin);
  EXPECT_EQ(second.rate, CopyRate::kPinned);
  ASSERT_EQ(sink_.records.size(), 1u);
  EXPECT_EQ(sink_.records[0].result, 0);
  EXPECT_EQ(sink_.records[0].ptr, reinterpret_cast<uintptr_t>(range_));
  EXPECT_EQ(sink_.records[0].bytes, 2 * kMiB);
  EXPECT_TRUE(sink_.records[0].to_device);
  EXPECT_EQ(pool_->Counters().autopins, 1u);

  const AutoPinCopy third = CopyToDevice(auto_pin);
  EXPECT_EQ(third.rate, CopyRate::kPinned);  // the range held already: no register
  EXPECT_EQ(sink_.records.size(), 1u);
  EXPECT_EQ(pool_->Counters().autopins, 1u);
  EXPECT_EQ(sink_.first_copies, 1);
  EXPECT_EQ(auto_pin.CopyStats().dir[0].pinned_rate_bytes, 4 * kMiB);

  // The driver holds the one registration, and the pool's release ends it.
  EXPECT_EQ(sim_->live_registrations(), registered_before + 1);
  EXPECT_EQ(pool_->ReleaseAll(EvictReason::kExit), 1);
  EXPECT_EQ(sim_->live_registrations(), registered_before);
}

TEST_F(AutoPinSimTest, NothingIsPinnedWithoutACurrentContext) {
  AutoPin auto_pin(pool_.get(), &env_, &sink_, AutoPinLimits{64 << 10, 64 * kMiB, 1});
  CUcontext popped;
  ASSERT_EQ(sim_->cuCtxPopCurrent_v2(&popped), CUDA_SUCCESS);
  const AutoPinCopy copy = CopyToDevice(auto_pin);
  ASSERT_EQ(sim_->cuCtxPushCurrent_v2(popped), CUDA_SUCCESS);
  EXPECT_EQ(copy.rate, CopyRate::kNone);
  EXPECT_TRUE(sink_.records.empty());
  EXPECT_EQ(pool_->Counters().autopins, 0u);
}

}  // namespace
}  // namespace lazypin
