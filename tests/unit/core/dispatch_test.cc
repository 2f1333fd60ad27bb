// Dispatch (shim/core/dispatch.h) with no hooks and no CUDA: a fake environment
// (clock, current context, record sink), the driver model as the driver,
// and a fake "cudart" that calls the driver level the way the real one does.
// Checks where each call is decided, that cudart's answer is what the program
// gets, and that every program call gives exactly one record.
#include "dispatch.h"
#include "fake_dispatch_env.h"

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "driver_model.h"
#include "gtest/gtest.h"
#include "pool.h"
#include "thread_state.h"

namespace lazypin {
namespace {

const Context kCtx = kFakeCtx;
constexpr uintptr_t kBuf = 0x100000;
constexpr size_t kBytes = 1 << 20;

using FakeEnv = FakeDispatchEnv;

class ModelPoolDriver final : public PoolDriver {
 public:
  explicit ModelPoolDriver(model::DriverModel* model) : model_(model) {}
  int Unregister(uintptr_t ptr, Context, ReleaseWait*) override {
    ++unregisters;
    return model_->Unregister(ptr);
  }
  bool ReadFrames(uintptr_t, size_t, std::vector<uint64_t>*) override { return false; }
  int64_t NowNs() override { return 0; }
  // The kernel watch: ranges whose pages changed, reported at the next drain.
  void DrainChanges(DrainScope, absl::FunctionRef<void(uintptr_t, uintptr_t)> changed) override {
    ++drains;
    for (auto [lo, hi] : changes) changed(lo, hi);
    changes.clear();
  }
  int unregisters = 0;
  int drains = 0;
  std::vector<std::pair<uintptr_t, uintptr_t>> changes;

 private:
  model::DriverModel* model_;
};

class NullObserver final : public PoolObserver {
 public:
  void OnEvict(uintptr_t, size_t, EvictReason, int, int64_t, const ReleaseWait&) override {}
  void OnWarning(const std::string&) override {}
};

class DispatchTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (GetParam()) pool_ = std::make_unique<Pool>(&pool_driver_, &observer_, DefaultPoolLimits());
    dispatch_ = std::make_unique<Dispatch>(&env_, &env_, pool_.get());
  }
  bool Deferring() const { return GetParam(); }

  // The driver level as the program (or cudart) reaches it.
  int DriverRegister(uintptr_t p, size_t bytes, unsigned flags, Api api = Api::kCuMemHostRegisterV2) {
    return dispatch_->Driver({api, Via::kGetProc, reinterpret_cast<void*>(p), bytes, flags}, [&] {
      ++driver_calls_;
      return model_.Register(p, bytes, flags, env_.ctx);
    });
  }
  int DriverUnregister(uintptr_t p) {
    return dispatch_->Driver({Api::kCuMemHostUnregister, Via::kGetProc, reinterpret_cast<void*>(p), 0, 0},
                             [&] {
                               ++driver_calls_;
                               return model_.Unregister(p);
                             });
  }
  // cudaHostRegister: a fake cudart that calls the driver `driver_times`
  // times (0: answers itself with `cudart_code`) and returns `cudart_code`
  // when set, else the driver's last answer.
  int RuntimeRegister(uintptr_t p, size_t bytes, int driver_times = 1, int cudart_code = -1) {
    return dispatch_->Runtime({Api::kCudaHostRegister, Via::kSymbol, reinterpret_cast<void*>(p), bytes, 0},
                              [&] {
                                int last = cudart_code;
                                for (int i = 0; i < driver_times; ++i) last = DriverRegister(p, bytes, 0);
                                return cudart_code >= 0 ? cudart_code : last;
                              });
  }
  int RuntimeUnregister(uintptr_t p, int driver_times = 1) {
    return dispatch_->Runtime({Api::kCudaHostUnregister, Via::kSymbol, reinterpret_cast<void*>(p), 0, 0},
                              [&] {
                                int last = 0;
                                for (int i = 0; i < driver_times; ++i) last = DriverUnregister(p);
                                return last;
                              });
  }
  const CallRecord& Last() const { return env_.records.back(); }

  FakeEnv env_;
  model::DriverModel model_;
  ModelPoolDriver pool_driver_{&model_};
  NullObserver observer_;
  std::unique_ptr<Pool> pool_;
  std::unique_ptr<Dispatch> dispatch_;
  int driver_calls_ = 0;
};

TEST_P(DispatchTest, RuntimeCallThroughTheDriverIsOneRecordAtTheRuntimeLevel) {
  ASSERT_EQ(RuntimeRegister(kBuf, kBytes), 0);
  ASSERT_EQ(env_.records.size(), 1u);
  EXPECT_EQ(Last().call.api, Api::kCudaHostRegister);
  EXPECT_EQ(Last().call.via, Via::kSymbol);
  EXPECT_EQ(Last().action, Deferring() ? Action::kMiss : Action::kForward);
  EXPECT_EQ(Last().result, 0);
  EXPECT_EQ(Last().latency_ns, 10 * 1) << "timed by the runtime level only";
  EXPECT_EQ(driver_calls_, 1);
  EXPECT_EQ(t_state.runtime_frame, nullptr) << "the frame is closed";
}

TEST_P(DispatchTest, RuntimeCallReachingTheDriverTwiceIsStillOneRecord) {
  // The second driver call is refused (712): cudart's answer is the program's.
  EXPECT_EQ(RuntimeRegister(kBuf, kBytes, /*driver_times=*/2), 712);
  ASSERT_EQ(env_.records.size(), 1u);
  EXPECT_EQ(Last().result, 712);
  EXPECT_EQ(driver_calls_, 2);
}

TEST_P(DispatchTest, RuntimeCallThatNeverReachesTheDriverRecordsCudartsAnswer) {
  EXPECT_EQ(RuntimeRegister(kBuf, kBytes, /*driver_times=*/0, /*cudart_code=*/3), 3);
  ASSERT_EQ(env_.records.size(), 1u);
  EXPECT_EQ(Last().result, 3);
  EXPECT_EQ(Last().action, Action::kForward);
  EXPECT_EQ(driver_calls_, 0);
}

TEST_P(DispatchTest, CudartsCodeWinsOverTheDriversAnswer) {
  // cudart maps the driver's 712 to its own code: that is what the program sees.
  EXPECT_EQ(RuntimeRegister(kBuf, kBytes), 0);
  EXPECT_EQ(RuntimeRegister(kBuf, kBytes, 1, /*cudart_code=*/712), 712);
  EXPECT_EQ(Last().result, 712);
}

TEST_P(DispatchTest, DriverCallsFromTheProgramAreRecordedAtTheDriverLevel) {
  ASSERT_EQ(DriverRegister(kBuf, kBytes, 0), 0);
  ASSERT_EQ(DriverUnregister(kBuf), 0);
  ASSERT_EQ(env_.records.size(), 2u);
  EXPECT_EQ(env_.records[0].call.api, Api::kCuMemHostRegisterV2);
  EXPECT_EQ(env_.records[1].call.api, Api::kCuMemHostUnregister);
  EXPECT_EQ(env_.records[1].action, Deferring() ? Action::kDeferred : Action::kForward);
  EXPECT_EQ(model_.regs().size(), Deferring() ? 1u : 0u) << "a deferral keeps the driver's registration";
}

TEST_P(DispatchTest, HitAtTheRuntimeLevelSkipsCudart) {
  ASSERT_EQ(RuntimeRegister(kBuf, kBytes), 0);
  ASSERT_EQ(RuntimeUnregister(kBuf), 0);
  const int before = driver_calls_;
  ASSERT_EQ(RuntimeRegister(kBuf, kBytes), 0);
  ASSERT_EQ(env_.records.size(), 3u);
  if (Deferring()) {
    EXPECT_EQ(env_.records[1].action, Action::kDeferred);
    EXPECT_EQ(Last().action, Action::kHit);
    EXPECT_EQ(driver_calls_, before) << "a hit calls neither cudart nor the driver";
  } else {
    EXPECT_EQ(Last().action, Action::kForward);
    EXPECT_EQ(driver_calls_, before + 1);
  }
}

TEST_P(DispatchTest, HitAtTheDriverLevel) {
  ASSERT_EQ(DriverRegister(kBuf, kBytes, 0), 0);
  ASSERT_EQ(DriverUnregister(kBuf), 0);
  ASSERT_EQ(DriverRegister(kBuf, kBytes, 0), 0);
  EXPECT_EQ(Last().action, Deferring() ? Action::kHit : Action::kForward);
  EXPECT_EQ(driver_calls_, Deferring() ? 1 : 3);
}

TEST_P(DispatchTest, NoCurrentContextSendsARuntimeRegisterThroughCudart) {
  ASSERT_EQ(RuntimeRegister(kBuf, kBytes), 0);
  ASSERT_EQ(RuntimeUnregister(kBuf), 0);
  env_.ctx = nullptr;  // cudart will make one current: the pool cannot know which here
  const int before = driver_calls_;
  RuntimeRegister(kBuf, kBytes);
  EXPECT_EQ(Last().action, Deferring() ? Action::kMiss : Action::kForward);
  EXPECT_EQ(driver_calls_, before + 1);
}

TEST_P(DispatchTest, ErrorCodesAreTheDriversOnEveryPath) {
  // 1: null pointer and zero bytes; 712: overlap; 713: not registered; 1: interior pointer.
  EXPECT_EQ(DriverRegister(0, kBytes, 0), 1);
  EXPECT_EQ(DriverRegister(kBuf, 0, 0), 1);
  EXPECT_EQ(RuntimeRegister(0, kBytes), 1);
  ASSERT_EQ(DriverRegister(kBuf, kBytes, 0), 0);
  EXPECT_EQ(DriverRegister(kBuf + 4096, 4096, 0), 712);
  EXPECT_EQ(RuntimeRegister(kBuf, kBytes), 712);
  EXPECT_EQ(DriverUnregister(kBuf + 8), 1);
  EXPECT_EQ(DriverUnregister(kBuf + 2 * kBytes), 713);
  EXPECT_EQ(RuntimeUnregister(kBuf + 2 * kBytes), 713);
  ASSERT_EQ(DriverUnregister(kBuf), 0);
  EXPECT_EQ(DriverUnregister(kBuf), 713) << "a second unregister, deferred or not";
  EXPECT_EQ(RuntimeUnregister(kBuf), 713);
  EXPECT_EQ(env_.records.size(), 12u) << "one record per program call";
  for (const CallRecord& r : env_.records) EXPECT_EQ(r.evicted >= 0, true);
  EXPECT_TRUE(model_.regs().empty());
}

TEST_P(DispatchTest, EvictionsOnBehalfOfARuntimeCallAreCountedInItsRecord) {
  if (!Deferring()) GTEST_SKIP() << "nothing is pooled in log mode";
  ASSERT_EQ(RuntimeRegister(kBuf, kBytes), 0);
  ASSERT_EQ(RuntimeUnregister(kBuf), 0);
  // Overlapping, not exact: the pooled one is really unregistered first, then the driver answers.
  ASSERT_EQ(RuntimeRegister(kBuf, kBytes / 2), 0);
  EXPECT_EQ(Last().action, Action::kMiss);
  EXPECT_EQ(Last().evicted, 1);
  EXPECT_EQ(pool_driver_.unregisters, 1);
}

TEST_P(DispatchTest, QueriesKeepPooledMemoryAndTeardownReleasesIt) {
  if (!Deferring()) GTEST_SKIP() << "nothing is pooled in log mode";
  ASSERT_EQ(DriverRegister(kBuf, kBytes, 0), 0);
  ASSERT_EQ(DriverUnregister(kBuf), 0);
  // A query sees what the program sees, unregistered memory: the driver is
  // asked about an address nobody registered, and the registration stays.
  const uintptr_t asked = dispatch_->QueryAddress(kBuf + 100);
  EXPECT_TRUE(asked < kBuf || asked >= kBuf + kBytes);
  EXPECT_FALSE(model_.regs().empty());
  EXPECT_EQ(dispatch_->QueryAddress(kBuf + kBytes), kBuf + kBytes) << "past the kept range: itself";
  ASSERT_EQ(DriverRegister(kBuf, kBytes, 0), 0);
  EXPECT_EQ(Last().action, Action::kHit);
  ASSERT_EQ(DriverUnregister(kBuf), 0);
  dispatch_->BeforeContextDestroy(kCtx);
  EXPECT_TRUE(model_.regs().empty());
  EXPECT_EQ(env_.records.size(), 4u) << "teardown and queries are not program calls of ours";
}

TEST_P(DispatchTest, APrimaryResetDropsOnlyThePrimaryContextsEntries) {
  if (!Deferring()) GTEST_SKIP() << "nothing is pooled in log mode";
  const Context made = reinterpret_cast<Context>(0x22);  // cuCtxCreate'd, same device
  const uintptr_t other = kBuf + 4 * kBytes;
  ASSERT_EQ(DriverRegister(kBuf, kBytes, 0), 0);
  ASSERT_EQ(DriverUnregister(kBuf), 0);
  env_.ctx = made;
  ASSERT_EQ(DriverRegister(other, kBytes, 0), 0);
  ASSERT_EQ(DriverUnregister(other), 0);
  env_.primary_ctx = kCtx;
  EXPECT_EQ(dispatch_->BeforePrimaryContextReset(0, true), kCtx);
  model_.DropContext(kCtx);  // the real reset
  ASSERT_EQ(model_.regs().size(), 1u) << "the other context's deferred entry stays";
  ASSERT_EQ(DriverRegister(other, kBytes, 0), 0);
  EXPECT_EQ(Last().action, Action::kHit);
  ASSERT_EQ(DriverUnregister(other), 0);
  // Where the primary context cannot be told: every context of the device.
  env_.primary_ctx = nullptr;
  EXPECT_EQ(dispatch_->BeforePrimaryContextReset(0, true), nullptr);
  EXPECT_TRUE(model_.regs().empty());
  env_.ctx = kCtx;
}

TEST_P(DispatchTest, ADeferredUnregisterFirstWaitsForTheDevice) {
  ASSERT_EQ(DriverRegister(kBuf, kBytes, 0), 0);
  ASSERT_EQ(DriverUnregister(kBuf), 0);
  EXPECT_EQ(env_.waits, Deferring() ? 1 : 0) << "log mode: the driver's unregister waits itself";
  ASSERT_EQ(RuntimeRegister(kBuf, kBytes), 0);
  const int before = driver_calls_;
  ASSERT_EQ(RuntimeUnregister(kBuf), 0);
  EXPECT_EQ(env_.waits, Deferring() ? 2 : 0);
  EXPECT_EQ(Last().action, Deferring() ? Action::kDeferred : Action::kForward);
  EXPECT_EQ(driver_calls_, Deferring() ? before : before + 1);
}

TEST_P(DispatchTest, AFailedWaitForwardsTheUnregister) {
  if (!Deferring()) GTEST_SKIP() << "log mode never waits";
  env_.wait_result = 900;  // say, a capture in progress
  ASSERT_EQ(DriverRegister(kBuf, kBytes, 0), 0);
  ASSERT_EQ(DriverUnregister(kBuf), 0);
  EXPECT_EQ(Last().action, Action::kForward);
  EXPECT_TRUE(model_.regs().empty()) << "the driver unregistered it";
  ASSERT_EQ(RuntimeRegister(kBuf, kBytes), 0);
  ASSERT_EQ(RuntimeUnregister(kBuf), 0);
  EXPECT_EQ(Last().action, Action::kForward);
  EXPECT_EQ(env_.waits, 2) << "cudart's driver call does not wait a second time";
  EXPECT_TRUE(model_.regs().empty());
}

TEST_P(DispatchTest, WithoutTheWaitADeferralCallsNothing) {
  if (!Deferring()) GTEST_SKIP() << "log mode never waits";
  dispatch_ = std::make_unique<Dispatch>(&env_, &env_, pool_.get(), /*unregister_wait=*/false);
  ASSERT_EQ(RuntimeRegister(kBuf, kBytes), 0);
  ASSERT_EQ(RuntimeUnregister(kBuf), 0);
  EXPECT_EQ(Last().action, Action::kDeferred);
  EXPECT_EQ(env_.waits, 0);
}

TEST_P(DispatchTest, AnUnregisterWithNoCurrentContextIsTheDriversAnswer) {
  ASSERT_EQ(DriverRegister(kBuf, kBytes, 0), 0);
  env_.ctx = nullptr;
  auto unregister = [&] {
    return dispatch_->Driver({Api::kCuMemHostUnregister, Via::kSymbol, reinterpret_cast<void*>(kBuf), 0, 0},
                             [&] { return env_.ctx == nullptr ? 201 : model_.Unregister(kBuf); });
  };
  EXPECT_EQ(unregister(), 201);
  EXPECT_EQ(Last().action, Action::kForward);
  EXPECT_EQ(env_.waits, 0);
  env_.ctx = kCtx;
  EXPECT_EQ(unregister(), 0);
  EXPECT_EQ(Last().action, Deferring() ? Action::kDeferred : Action::kForward);
  EXPECT_EQ(unregister(), 713);
  EXPECT_TRUE(model_.regs().empty());
}

TEST_P(DispatchTest, ARuntimeUnregisterOnAThreadWithNoContextGoesThroughCudart) {
  ASSERT_EQ(RuntimeRegister(kBuf, kBytes), 0);
  env_.ctx = nullptr;
  int cudart_calls = 0;
  const int rc = dispatch_->Runtime(
      {Api::kCudaHostUnregister, Via::kSymbol, reinterpret_cast<void*>(kBuf), 0, 0}, [&] {
        ++cudart_calls;
        env_.ctx = kCtx;  // cudart makes the primary context current first
        return DriverUnregister(kBuf);
      });
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(cudart_calls, 1);
  EXPECT_EQ(Last().action, Deferring() ? Action::kDeferred : Action::kForward);
  EXPECT_EQ(env_.waits, Deferring() ? 1 : 0) << "waited once, beneath cudart";
}

TEST_P(DispatchTest, APrimaryContextReleasedToZeroForgetsItsRegistrations) {
  if (!Deferring()) GTEST_SKIP() << "nothing is kept in log mode";
  ASSERT_EQ(DriverRegister(kBuf, kBytes, 0), 0);
  env_.primary_active = true;  // released, still retained elsewhere: kept
  dispatch_->AfterPrimaryContextRelease(0, nullptr);
  ASSERT_EQ(DriverUnregister(kBuf), 0);
  EXPECT_EQ(Last().action, Action::kDeferred);
  ASSERT_EQ(DriverRegister(kBuf, kBytes, 0), 0);  // a hit
  env_.primary_active = false;  // the last reference: the driver dropped it
  model_.DropContext(kCtx);
  dispatch_->AfterPrimaryContextRelease(0, nullptr);
  EXPECT_EQ(DriverUnregister(kBuf), 713) << "the driver's answer, not a deferral";
  EXPECT_EQ(Last().action, Action::kForward);
  EXPECT_EQ(DriverRegister(kBuf, kBytes, 0), 0);
  EXPECT_EQ(Last().action, Action::kMiss) << "no hit on what the driver no longer holds";
}

TEST_P(DispatchTest, ACopyFromMemoryTheProgramUnregisteredSynchronizesItsStream) {
  void* const stream = reinterpret_cast<void*>(0x5);
  constexpr uintptr_t kOther = kBuf + 16 * kBytes;
  ASSERT_EQ(DriverRegister(kBuf, kBytes, 0), 0);
  ASSERT_EQ(DriverRegister(kOther, kBytes, 0), 0);
  dispatch_->AfterAsyncCopy(kBuf, kBuf + kBytes, stream);
  EXPECT_TRUE(env_.synced.empty()) << "registered memory copies asynchronously";
  ASSERT_EQ(DriverUnregister(kOther), 0);
  dispatch_->AfterAsyncCopy(kBuf, kBuf + kBytes, stream);
  EXPECT_TRUE(env_.synced.empty()) << "something deferred elsewhere changes nothing";
  dispatch_->AfterAsyncCopy(kOther + 4096, kOther + 8192, stream);
  if (Deferring()) {
    ASSERT_EQ(env_.synced.size(), 1u) << "pageable to the program: the copy completes first";
    EXPECT_EQ(env_.synced[0], stream);
  } else {
    EXPECT_TRUE(env_.synced.empty());
  }
}

TEST_P(DispatchTest, ACopyAppliesTheWatchsChangesToMemoryTheProgramUnregistered) {
  constexpr uintptr_t kOther = kBuf + 16 * kBytes;
  ASSERT_EQ(DriverRegister(kBuf, kBytes, 0), 0);
  const int registered = pool_driver_.drains;
  dispatch_->BeforeCopy(kBuf, kBuf + kBytes);
  EXPECT_EQ(pool_driver_.drains, registered) << "nothing deferred: no drain";
  ASSERT_EQ(DriverUnregister(kBuf), 0);
  const int drains = pool_driver_.drains;
  pool_driver_.changes.push_back({kBuf + 4096, kBuf + 8192});  // a raw munmap, say
  dispatch_->BeforeCopy(kOther, kOther + kBytes);
  EXPECT_EQ(pool_driver_.drains, drains) << "a copy elsewhere does not drain";
  dispatch_->BeforeCopy(kBuf + kBytes - 1, kBuf + kBytes);
  if (!Deferring()) {
    EXPECT_EQ(pool_driver_.drains, drains);
    return;
  }
  EXPECT_EQ(pool_driver_.drains, drains + 1);
  EXPECT_EQ(pool_driver_.unregisters, 1) << "the changed registration goes before the copy";
  EXPECT_EQ(model_.Register(kBuf, kBytes, 0, kCtx), 0) << "the driver holds nothing there";
}

// The program registered kBytes, unregistered them (deferred), then copies
// past them from their base: the driver would refuse that copy over its
// registration (1), bare it is pageable. A copy inside them runs through it.
TEST_P(DispatchTest, ACopyOverPartOfMemoryTheProgramUnregisteredReleasesItFirst) {
  ASSERT_EQ(DriverRegister(kBuf, kBytes, 0), 0);
  ASSERT_EQ(DriverUnregister(kBuf), 0);
  const int unregisters = pool_driver_.unregisters;
  dispatch_->BeforeCopy(kBuf + 4096, kBuf + kBytes);
  EXPECT_EQ(pool_driver_.unregisters, unregisters) << "inside it: kept";
  dispatch_->BeforeCopy(kBuf, kBuf + 16 * kBytes);
  EXPECT_EQ(pool_driver_.unregisters, unregisters + (Deferring() ? 1 : 0));
  EXPECT_EQ(model_.Register(kBuf, kBytes, 0, kCtx), 0) << "the driver holds nothing there";
}

// A copy from memory the program holds registered is never synchronized,
// with nothing deferred and with something deferred elsewhere: it stays
// asynchronous. (Its cost, a few loads, is bench/pool_bench BM_MaybeHolds.)
TEST_P(DispatchTest, CopyFromRegisteredMemoryIsNeverSynchronized) {
  if (!Deferring()) GTEST_SKIP() << "the guard runs in defer mode";
  constexpr uintptr_t kOther = kBuf + 16 * kBytes;
  ASSERT_EQ(DriverRegister(kBuf, kBytes, 0), 0);
  auto copy_many = [&] {
    for (int i = 0; i < 1000; ++i) {
      dispatch_->BeforeCopy(kBuf + (i & 255), kBuf + kBytes);
      dispatch_->AfterAsyncCopy(kBuf + (i & 255), kBuf + kBytes, nullptr);
    }
  };
  copy_many();
  EXPECT_TRUE(env_.synced.empty()) << "nothing deferred";
  ASSERT_EQ(DriverRegister(kOther, kBytes, 0), 0);
  ASSERT_EQ(DriverUnregister(kOther), 0);
  const int drains = pool_driver_.drains;
  copy_many();
  EXPECT_TRUE(env_.synced.empty()) << "something deferred elsewhere";
  EXPECT_EQ(pool_driver_.drains, drains) << "nor does it drain the watch";
}

TEST_P(DispatchTest, OnlyASourceTheProgramUnregisteredIsStaged) {
  // A host-to-device copy's source: memory the program holds registered, or
  // memory nobody registered, is copied as asked; memory the program
  // unregistered (deferred) is staged (hooks_driver.cc), in any part of it.
  constexpr uintptr_t kOther = kBuf + 16 * kBytes;
  ASSERT_EQ(DriverRegister(kBuf, kBytes, 0), 0);
  EXPECT_FALSE(dispatch_->CopiesFromDeferred(kBuf, kBuf + kBytes)) << "registered";
  EXPECT_FALSE(dispatch_->CopiesFromDeferred(kOther, kOther + kBytes)) << "never registered";
  ASSERT_EQ(DriverRegister(kOther, kBytes, 0), 0);
  ASSERT_EQ(DriverUnregister(kOther), 0);
  EXPECT_EQ(dispatch_->CopiesFromDeferred(kOther + 1, kOther + 2), Deferring());
  EXPECT_EQ(dispatch_->CopiesFromDeferred(kOther - 8, kOther + 1), Deferring()) << "overlap";
  EXPECT_FALSE(dispatch_->CopiesFromDeferred(kBuf, kBuf + kBytes)) << "still registered";
  EXPECT_FALSE(dispatch_->StreamIdle(nullptr)) << "unknown: staged";
  EXPECT_TRUE(env_.synced.empty()) << "deciding waits for nothing";
}

TEST_P(DispatchTest, UnregisterThatACaptureForbidsGetsTheDriversRefusal) {
  // Another thread captures in global mode: the driver refuses this thread's
  // unregister (900) and keeps the registration. Deferred, the program would
  // see 0; forwarded, it sees the refusal, and the pool keeps the entry in use.
  ASSERT_EQ(RuntimeRegister(kBuf, kBytes), 0);
  env_.capture_forbids = true;
  const ProgramCall unregister{Api::kCudaHostUnregister, Via::kSymbol, reinterpret_cast<void*>(kBuf), 0, 0};
  const ProgramCall driver_unregister{Api::kCuMemHostUnregister, Via::kGetProc,
                                      reinterpret_cast<void*>(kBuf), 0, 0};
  EXPECT_EQ(dispatch_->Runtime(unregister, [&] {
              return dispatch_->Driver(driver_unregister, [&] {
                ++driver_calls_;
                return 900;
              });
            }),
            900);
  EXPECT_EQ(Last().action, Action::kForward);
  EXPECT_EQ(Last().result, 900);
  EXPECT_EQ(driver_calls_, 2) << "the unregister reached the driver";
  // Once the capture is over, the same unregister is deferred as usual.
  env_.capture_forbids = false;
  EXPECT_EQ(RuntimeUnregister(kBuf), 0);
  EXPECT_EQ(Last().action, Deferring() ? Action::kDeferred : Action::kForward);
}

TEST_P(DispatchTest, UnregisterThatACaptureForbidsIsForwardedAtTheDriverLevel) {
  ASSERT_EQ(DriverRegister(kBuf, kBytes, 0), 0);
  env_.capture_forbids = true;
  EXPECT_EQ(DriverUnregister(kBuf), 0) << "the driver allowed it: its answer";
  EXPECT_EQ(Last().action, Action::kForward);
  EXPECT_EQ(driver_calls_, 2);
  if (Deferring()) {
    EXPECT_TRUE(pool_->Empty()) << "nothing pooled: the driver unregistered it";
  }
  env_.capture_forbids = false;
  EXPECT_EQ(DriverRegister(kBuf, kBytes, 0), 0);
  EXPECT_EQ(Last().action, Deferring() ? Action::kMiss : Action::kForward) << "no stale hit";
  EXPECT_EQ(driver_calls_, 3);
}

INSTANTIATE_TEST_SUITE_P(Modes, DispatchTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "defer" : "log"; });

}  // namespace
}  // namespace lazypin
