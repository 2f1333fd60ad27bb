// CaptureTracker (shim/core/capture.h): the captures in progress, per context, and
// the driver's rule for which thread may make an unsafe call meanwhile.
#include "capture.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace lazypin {
namespace {

const Context kCtxA = reinterpret_cast<Context>(0xA);
const Context kCtxB = reinterpret_cast<Context>(0xB);
constexpr uint64_t kMe = 1, kOther = 2;

TEST(CaptureTracker, NothingInProgressAnswersNo) {
  CaptureTracker t;
  EXPECT_FALSE(t.Any());
  EXPECT_FALSE(t.InProgress(kCtxA));
  EXPECT_FALSE(t.ForbidsUnsafeCall(kMe, CaptureMode::kGlobal));
}

TEST(CaptureTracker, CapturesArePerContextUntilEnded) {
  CaptureTracker t;
  t.Begin(100, kCtxA, CaptureMode::kRelaxed, kOther);
  EXPECT_TRUE(t.Any());
  EXPECT_TRUE(t.InProgress(kCtxA));
  EXPECT_FALSE(t.InProgress(kCtxB));
  t.Begin(200, kCtxA, CaptureMode::kGlobal, kOther);
  t.Ended(100);
  EXPECT_TRUE(t.InProgress(kCtxA)) << "the second capture is still in progress";
  t.Ended(200);
  EXPECT_FALSE(t.InProgress(kCtxA));
  EXPECT_FALSE(t.Any());
  t.Ended(200);  // an end the driver refused twice changes nothing
  EXPECT_FALSE(t.Any());
}

TEST(CaptureTracker, RefusedBeginWasNeverInProgress) {
  CaptureTracker t;
  t.Begin(100, kCtxA, CaptureMode::kGlobal, kOther);
  // A second begin on the same stream, refused by the driver (illegal state):
  // the first capture stays in progress.
  t.Refused(t.Begin(100, kCtxA, CaptureMode::kGlobal, kOther));
  EXPECT_TRUE(t.InProgress(kCtxA));
  t.Ended(100);
  EXPECT_FALSE(t.Any());
}

TEST(CaptureTracker, TheDriversRuleForUnsafeCalls) {
  CaptureTracker t;
  // Another thread's relaxed or thread-local capture forbids nothing here.
  t.Begin(1, kCtxA, CaptureMode::kRelaxed, kOther);
  t.Begin(2, kCtxA, CaptureMode::kThreadLocal, kOther);
  EXPECT_FALSE(t.ForbidsUnsafeCall(kMe, CaptureMode::kGlobal));
  // ...but forbids its own thread, in global or thread-local mode.
  EXPECT_TRUE(t.ForbidsUnsafeCall(kOther, CaptureMode::kGlobal));
  EXPECT_TRUE(t.ForbidsUnsafeCall(kOther, CaptureMode::kThreadLocal));
  EXPECT_FALSE(t.ForbidsUnsafeCall(kOther, CaptureMode::kRelaxed));
  // Another thread's global capture forbids a thread in global mode only.
  t.Begin(3, kCtxB, CaptureMode::kGlobal, kOther);
  EXPECT_TRUE(t.ForbidsUnsafeCall(kMe, CaptureMode::kGlobal));
  EXPECT_FALSE(t.ForbidsUnsafeCall(kMe, CaptureMode::kThreadLocal));
  EXPECT_FALSE(t.ForbidsUnsafeCall(kMe, CaptureMode::kRelaxed));
  t.Ended(3);
  EXPECT_FALSE(t.ForbidsUnsafeCall(kMe, CaptureMode::kGlobal));
}

TEST(CaptureTracker, PastTheSlotsEveryAnswerIsConservative) {
  CaptureTracker t;
  for (uint64_t s = 1; s <= CaptureTracker::kSlots; ++s) t.Begin(s, kCtxA, CaptureMode::kRelaxed, kOther);
  EXPECT_FALSE(t.InProgress(kCtxB));
  t.Begin(9999, kCtxA, CaptureMode::kRelaxed, kOther);  // no slot left
  EXPECT_TRUE(t.InProgress(kCtxB)) << "its context is unknown";
  EXPECT_TRUE(t.ForbidsUnsafeCall(kMe, CaptureMode::kGlobal));
  t.Ended(9999);
  EXPECT_FALSE(t.InProgress(kCtxB));
  for (uint64_t s = 1; s <= CaptureTracker::kSlots; ++s) t.Ended(s);
  EXPECT_FALSE(t.Any());
}

TEST(CaptureTracker, ConcurrentBeginsAndEndsBalance) {
  CaptureTracker t;
  std::vector<std::thread> threads;
  for (uint64_t k = 0; k < 8; ++k) {
    threads.emplace_back([&t, k] {
      for (uint64_t i = 0; i < 10000; ++i) {
        const uint64_t stream = k * 1000000 + i;
        t.Begin(stream, kCtxA, CaptureMode::kGlobal, k);
        t.Ended(stream);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_FALSE(t.Any());
  EXPECT_FALSE(t.InProgress(kCtxA));
}

}  // namespace
}  // namespace lazypin
