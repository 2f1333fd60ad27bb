// Dispatch's host-allocation path (shim/core/dispatch_host_alloc.cc) with no hooks
// and no CUDA: a fake environment, a fake driver of host blocks, and a fake
// cudart whose cudaHostAlloc / cudaFreeHost call the driver level as the real
// one does. One record per program call, the decision taken at the driver
// level, the implicit wait, and what forwards.
#include <stdlib.h>

#include <map>
#include <memory>
#include <vector>

#include "dispatch.h"
#include "fake_dispatch_env.h"
#include "gtest/gtest.h"
#include "host_alloc_cache.h"
#include "test_limits.h"
#include "thread_state.h"

namespace lazypin {
namespace {

const Context kCtx = kFakeCtx;
constexpr int kInvalidValue = 1;
constexpr int kInvalidContext = 201;

using FakeEnv = FakeDispatchEnv;

// The driver's host blocks (real memory: served blocks are zeroed).
class FakeHostDriver final : public HostAllocDriver {
 public:
  ~FakeHostDriver() override {
    for (auto& [p, n] : blocks) free(reinterpret_cast<void*>(p));
  }
  int Alloc(void** out, size_t bytes, Context ctx) {
    ++program_calls;
    if (ctx == nullptr) return kInvalidContext;
    *out = aligned_alloc(4096, HostAllocCache::Span(bytes));
    blocks[reinterpret_cast<uintptr_t>(*out)] = bytes;
    return 0;
  }
  int ProgramFree(void* p, Context ctx) {
    ++program_calls;
    if (ctx == nullptr) return kInvalidContext;
    return Erase(reinterpret_cast<uintptr_t>(p));
  }
  bool Flags(uintptr_t, unsigned*) override { return false; }
  int Free(uintptr_t p, Context, ReleaseWait*) override {
    ++own_frees;
    return Erase(p);
  }
  int64_t NowNs() override { return 0; }
  std::map<uintptr_t, size_t> blocks;
  int program_calls = 0, own_frees = 0;

 private:
  int Erase(uintptr_t p) {
    auto it = blocks.find(p);
    if (it == blocks.end()) return kInvalidValue;
    free(reinterpret_cast<void*>(p));
    blocks.erase(it);
    return 0;
  }
};

class DispatchHostAllocTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    env_.primary_active = false;  // a primary release drops to zero here
    Make(/*unregister_wait=*/true);
  }
  void Make(bool unregister_wait) {
    cache_.reset();
    if (GetParam()) cache_ = std::make_unique<HostAllocCache>(&driver_, nullptr, DefaultHostAllocLimits());
    dispatch_ = std::make_unique<Dispatch>(&env_, &env_, nullptr, unregister_wait, cache_.get());
  }
  bool Caching() const { return GetParam(); }

  int DriverAlloc(void** out, size_t bytes) {
    return dispatch_->HostDriver({Api::kCuMemHostAlloc, Via::kGetProc, nullptr, bytes, 0}, out,
                                 [&] { return driver_.Alloc(out, bytes, env_.ctx); });
  }
  int DriverFree(void* p) {
    return dispatch_->HostDriver({Api::kCuMemFreeHost, Via::kGetProc, p, 0, 0}, nullptr,
                                 [&] { return driver_.ProgramFree(p, env_.ctx); });
  }
  // cudart: makes a context current if none is (as cudart's lazy set-up does),
  // then calls the driver level once.
  int RuntimeAlloc(void** out, size_t bytes) {
    return dispatch_->HostRuntime({Api::kCudaHostAlloc, Via::kSymbol, nullptr, bytes, 0}, out, [&] {
      env_.ctx = kCtx;
      return DriverAlloc(out, bytes);
    });
  }
  int RuntimeFree(void* p) {
    return dispatch_->HostRuntime({Api::kCudaFreeHost, Via::kSymbol, p, 0, 0}, nullptr, [&] {
      env_.ctx = kCtx;
      return DriverFree(p);
    });
  }

  FakeEnv env_;
  FakeHostDriver driver_;
  std::unique_ptr<HostAllocCache> cache_;
  std::unique_ptr<Dispatch> dispatch_;
};

TEST_P(DispatchHostAllocTest, OneRecordPerRuntimeCallAndTheDecisionBeneath) {
  void* p = nullptr;
  ASSERT_EQ(RuntimeAlloc(&p, 1 << 20), 0);
  ASSERT_EQ(env_.records.size(), 1u);
  EXPECT_EQ(env_.records[0].call.api, Api::kCudaHostAlloc);
  EXPECT_EQ(env_.records[0].call.ptr, p);  // the block returned
  EXPECT_EQ(env_.records[0].call.bytes, size_t{1} << 20);
  EXPECT_EQ(env_.records[0].action, Caching() ? Action::kMiss : Action::kForward);
  EXPECT_EQ(RuntimeFree(p), 0);
  ASSERT_EQ(env_.records.size(), 2u);
  EXPECT_EQ(env_.records[1].call.api, Api::kCudaFreeHost);
  EXPECT_EQ(env_.records[1].action, Caching() ? Action::kDeferred : Action::kForward);
  EXPECT_EQ(env_.waits, Caching() ? 1 : 0);  // the kept free waited, as the driver's does
  void* q = nullptr;
  ASSERT_EQ(RuntimeAlloc(&q, 1 << 20), 0);
  EXPECT_EQ(env_.records.back().action, Caching() ? Action::kHit : Action::kForward);
  if (Caching()) {
    EXPECT_EQ(q, p);  // (a fresh block may have the same address too)
  }
  EXPECT_EQ(driver_.program_calls, Caching() ? 1 : 3);
  EXPECT_EQ(env_.records.size(), 3u);
}

TEST_P(DispatchHostAllocTest, DriverCallsAreRecordedThemselves) {
  void* p = nullptr;
  ASSERT_EQ(DriverAlloc(&p, 4096), 0);
  EXPECT_EQ(DriverFree(p), 0);
  ASSERT_EQ(env_.records.size(), 2u);
  EXPECT_EQ(env_.records[0].call.api, Api::kCuMemHostAlloc);
  EXPECT_EQ(env_.records[1].call.api, Api::kCuMemFreeHost);
  EXPECT_EQ(env_.records[1].call.ptr, p);
}

TEST_P(DispatchHostAllocTest, NoContextIsTheDriversAnswer) {
  env_.ctx = nullptr;
  void* p = nullptr;
  EXPECT_EQ(DriverAlloc(&p, 4096), kInvalidContext);
  EXPECT_EQ(env_.records.back().call.ptr, nullptr);
  EXPECT_EQ(DriverFree(reinterpret_cast<void*>(0x1000)), kInvalidContext);
  EXPECT_EQ(env_.records.back().action, Action::kForward);
}

TEST_P(DispatchHostAllocTest, ACaptureOrAFailedWaitFreesThroughTheDriver) {
  void* p = nullptr;
  void* q = nullptr;
  DriverAlloc(&p, 4096);
  DriverAlloc(&q, 4096);
  env_.capture_forbids = true;
  EXPECT_EQ(DriverFree(p), 0);
  EXPECT_EQ(env_.records.back().action, Action::kForward);
  EXPECT_EQ(env_.waits, 0);
  env_.capture_forbids = false;
  env_.wait_result = 900;
  EXPECT_EQ(DriverFree(q), 0);
  EXPECT_EQ(env_.records.back().action, Action::kForward);
  EXPECT_TRUE(driver_.blocks.empty());
}

TEST_P(DispatchHostAllocTest, WithoutTheWaitNoneIsMade) {
  Make(/*unregister_wait=*/false);
  void* p = nullptr;
  DriverAlloc(&p, 4096);
  DriverFree(p);
  EXPECT_EQ(env_.waits, 0);
  EXPECT_EQ(env_.records.back().action, Caching() ? Action::kDeferred : Action::kForward);
}

TEST_P(DispatchHostAllocTest, QueriesAndRegistersOfAKeptBlockFreeItFirst) {
  if (!Caching()) GTEST_SKIP() << "nothing kept without the cache";
  void* p = nullptr;
  void* q = nullptr;
  DriverAlloc(&p, 8192);
  DriverAlloc(&q, 8192);
  DriverFree(p);
  DriverFree(q);
  dispatch_->QueryAddress(reinterpret_cast<uintptr_t>(p) + 5000);
  EXPECT_EQ(driver_.own_frees, 1);
  EXPECT_EQ(driver_.blocks.count(reinterpret_cast<uintptr_t>(p)), 0u);
  // A register overlapping the other block: freed first, then the driver answers.
  dispatch_->Driver({Api::kCuMemHostRegisterV2, Via::kSymbol, static_cast<char*>(q) + 4096, 4096, 0},
                    [] { return 0; });
  EXPECT_EQ(driver_.own_frees, 2);
  EXPECT_FALSE(cache_->MaybeHolds());
}

TEST_P(DispatchHostAllocTest, ContextTeardownForgetsItsBlocks) {
  if (!Caching()) GTEST_SKIP() << "nothing kept without the cache";
  void* p = nullptr;
  DriverAlloc(&p, 4096);
  DriverFree(p);
  dispatch_->BeforeContextDestroy(kCtx);
  EXPECT_EQ(driver_.own_frees, 0);
  EXPECT_FALSE(cache_->MaybeHolds());
  void* q = nullptr;
  DriverAlloc(&q, 4096);
  EXPECT_EQ(env_.records.back().action, Action::kMiss);
}

INSTANTIATE_TEST_SUITE_P(LogAndDefer, DispatchHostAllocTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Cache" : "NoCache"; });

}  // namespace
}  // namespace lazypin
