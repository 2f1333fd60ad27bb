// The pool's and the host-allocation cache's route to the driver
// (shim/cuda/cuda_pool_driver.h), against the simulated driver (tests/simcuda),
// loaded at run time as a program's runtime loads libcuda.so.1: lazypin's own
// unregisters and host frees, made with the registration's context current
// and outside any capture, after a bounded wait for the GPU that a capture in
// progress skips; the other devices that wait covers; admission, page frames
// and clocks; and what each answers while no driver is loaded.
#include "cuda_pool_driver.h"

#include <dlfcn.h>
#include <errno.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "capture.h"
#include "cuda.h"
#include "cuda_env.h"
#include "host_alloc_cache.h"
#include "sim_driver.h"
#include "sys.h"

namespace lazypin {
namespace {

using ::testing::Contains;
using ::testing::Not;

using namespace sim_driver;  // NOLINT: the tests' own helpers
constexpr size_t kBytes = 64 * 1024;

// Whether the calling thread may touch [p, p + bytes) (a write from it
// faults otherwise: EFAULT).
bool Accessible(const void* p, size_t bytes) {
  int fds[2];
  if (pipe(fds) != 0) return false;
  const ssize_t n = write(fds[1], p, bytes);
  const int error = errno;
  close(fds[0]);
  close(fds[1]);
  return n == static_cast<ssize_t>(bytes) || (n < 0 && error != EFAULT);
}

class CudaPoolDriverTest : public SimDriverTest {
 protected:
  void SetUp() override {
    SimDriverTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    buffer_ = static_cast<char*>(p);
    driver_ = MakeCudaPoolDriver(nullptr, /*defer_shared=*/true, /*prefault_threads=*/0);
  }

  void TearDown() override {
    if (sim_ != nullptr && buffer_ != nullptr) {
      EndWork();
      sim_->cuMemHostUnregister(buffer_);  // 713 when no longer registered
      munmap(buffer_, kBytes);
    }
    SimDriverTest::TearDown();
  }

  uintptr_t Register() {
    EXPECT_EQ(sim_->cuMemHostRegister_v2(buffer_, kBytes, 0), CUDA_SUCCESS);
    return reinterpret_cast<uintptr_t>(buffer_);
  }

  char* buffer_ = nullptr;
  std::unique_ptr<PoolDriver> driver_;
};

// ------------------------------------------------------------ no driver ----
// Without a loaded libcuda: the release is the driver's "not initialized"
// (3), the waits untouched, one device, no primary context, no other
// contexts; nothing loads the driver. (A test of its own: the driver, once
// loaded, stays.)
TEST(CudaPoolDriverNoDriverTest, ReleasesAreNotInitializedWithoutLoadingTheDriver) {
  if (DriverLoaded()) GTEST_SKIP() << "needs a process without libcuda.so.1";
  const Context ctx = reinterpret_cast<Context>(0x10);
  auto driver = MakeCudaPoolDriver(nullptr, true, 0);
  ReleaseWait wait;
  EXPECT_EQ(driver->Unregister(0x100000, ctx, &wait), CUDA_ERROR_NOT_INITIALIZED);
  EXPECT_FALSE(wait.forced);
  EXPECT_EQ(wait.waited_ns, 0);
  auto host = MakeCudaHostAllocDriver();
  EXPECT_EQ(host->Free(0x100000, ctx, &wait), CUDA_ERROR_NOT_INITIALIZED);
  unsigned flags = 0;
  EXPECT_FALSE(host->Flags(0x100000, &flags));
  EXPECT_EQ(DeviceCount(), 1);
  EXPECT_EQ(ActivePrimaryContext(0), nullptr);
  Context out[kMaxDevices];
  EXPECT_EQ(OtherDeviceContexts(ctx, out, kMaxDevices), 0);
  EXPECT_FALSE(DriverLoaded());
}

// ------------------------------------------------------- one device ----
TEST_F(CudaPoolDriverTest, OneDeviceHasNoOtherContexts) {
  EXPECT_EQ(DeviceCount(), 1);
  CUcontext created = nullptr;
  ASSERT_EQ(sim_->cuCtxCreate_v4(&created, nullptr, 0, 0), CUDA_SUCCESS);
  driver_->PrepareRelease(created);  // a waiter: the driver knows the context
  ASSERT_EQ(sim_->cuCtxDestroy_v2(created), CUDA_SUCCESS);
  Context out[kMaxDevices];
  EXPECT_EQ(OtherDeviceContexts(primary_, out, kMaxDevices), 0);
}

TEST_F(CudaPoolDriverTest, UnregisterEndsTheRegistration) {
  const unsigned long before = sim_->live_registrations();
  const uintptr_t ptr = Register();
  ASSERT_EQ(sim_->live_registrations(), before + 1);
  ReleaseWait wait;
  EXPECT_EQ(driver_->Unregister(ptr, primary_, &wait), CUDA_SUCCESS);
  EXPECT_FALSE(wait.forced);
  EXPECT_EQ(sim_->live_registrations(), before);
  EXPECT_EQ(driver_->Unregister(ptr, primary_, &wait), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  EXPECT_EQ(CurrentOnThisThread(), primary_);
}

TEST_F(CudaPoolDriverTest, UnregisterReturnsTheDriversAnswer) {
  const uintptr_t ptr = Register();
  ReleaseWait wait;
  EXPECT_EQ(driver_->Unregister(ptr + 4096, primary_, &wait), CUDA_ERROR_INVALID_VALUE)
      << "an interior pointer";
  EXPECT_EQ(driver_->Unregister(ptr, primary_, &wait), CUDA_SUCCESS) << "still registered";
}

// Whichever thread releases, the registration's context is current for the
// unregister (the driver answers 201 on a thread with none), and only then.
TEST_F(CudaPoolDriverTest, UnregisterMakesTheContextCurrentOnAnyThread) {
  const uintptr_t ptr = Register();
  CUresult bare = CUDA_SUCCESS;
  int result = -1;
  Context after = primary_;
  std::thread([&] {
    bare = sim_->cuMemHostUnregister(buffer_);
    ReleaseWait wait;
    driver_->PrepareReleasingThread();
    result = driver_->Unregister(ptr, primary_, &wait);
    after = CurrentOnThisThread();
  }).join();
  EXPECT_EQ(bare, CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(result, CUDA_SUCCESS);
  EXPECT_EQ(after, nullptr);
}

// The release first waits, on this thread, for the work in flight in the
// context: the whole of it lies inside the reported wait.
TEST_F(CudaPoolDriverTest, UnregisterWaitsForTheWorkInFlightFirst) {
  const uintptr_t ptr = Register();
  driver_->PrepareRelease(primary_);
  Queue(stream_, &work_, kWorkNs);
  const int64_t start = MonotonicNs();
  ReleaseWait wait;
  EXPECT_EQ(driver_->Unregister(ptr, primary_, &wait), CUDA_SUCCESS);
  EXPECT_FALSE(wait.forced);
  EXPECT_TRUE(work_.done.load());
  EXPECT_GE(wait.waited_ns, work_.until_ns - start);
}

// The release after one that waited for the same context does not wait again.
TEST_F(CudaPoolDriverTest, UnregisterAfterAWaitDoesNotWaitAgain) {
  const uintptr_t ptr = Register();
  Queue(stream_, &work_, kWorkNs);
  ReleaseWait wait;
  wait.after_wait = true;
  EXPECT_EQ(driver_->Unregister(ptr, primary_, &wait), CUDA_SUCCESS);
  EXPECT_EQ(wait.waited_ns, 0);
  EXPECT_FALSE(wait.forced);
}

// A capture in progress in the context: no wait (reported forced), and the
// unregister is made in relaxed mode, which the driver accepts without
// invalidating the capture (a bare one on this thread gives 900); the
// thread's own mode is left as it was.
TEST_F(CudaPoolDriverTest, UnregisterUnderCaptureSkipsTheWaitAndKeepsTheCapture) {
  const uintptr_t ptr = Register();
  BeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL);
  ReleaseWait wait;
  EXPECT_EQ(driver_->Unregister(ptr, primary_, &wait), CUDA_SUCCESS);
  EXPECT_TRUE(wait.forced);
  EXPECT_EQ(wait.waited_ns, 0);
  EXPECT_EQ(CaptureStatus(stream_), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_EQ(ThreadCaptureMode(), CU_STREAM_CAPTURE_MODE_GLOBAL);
  EXPECT_EQ(EndCapture(stream_), CUDA_SUCCESS);
}

// A GPU that does not go idle: the wait ends at kReleaseWaitNs, reported
// forced, and the release goes ahead (the driver's own unregister then waits
// for the work, as it does bare).
TEST_F(CudaPoolDriverTest, UnregisterWaitIsBounded) {
  const uintptr_t ptr = Register();
  driver_->PrepareRelease(primary_);
  Queue(stream_, &work_);
  std::atomic<int64_t> start{0};
  std::thread releaser([&] {
    while (start.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const int64_t at = start.load() + 2 * kReleaseWaitNs;  // well past the bound
    while (MonotonicNs() < at) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    work_.release.store(true);
  });
  start.store(MonotonicNs());
  ReleaseWait wait;
  const int result = driver_->Unregister(ptr, primary_, &wait);
  releaser.join();
  EXPECT_EQ(result, CUDA_SUCCESS);
  EXPECT_TRUE(wait.forced);
  EXPECT_GE(wait.waited_ns, kReleaseWaitNs);
}

// ------------------------------------------------- host-allocation frees ----
TEST_F(CudaPoolDriverTest, HostFlagsAreTheDriversForABlockOnly) {
  void* block = nullptr;
  ASSERT_EQ(sim_->cuMemHostAlloc(&block, kBytes, CU_MEMHOSTALLOC_PORTABLE), CUDA_SUCCESS);
  auto host = MakeCudaHostAllocDriver();
  unsigned flags = 0;
  EXPECT_TRUE(host->Flags(reinterpret_cast<uintptr_t>(block), &flags));
  EXPECT_EQ(flags, unsigned{CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP});
  flags = 77;
  EXPECT_FALSE(host->Flags(reinterpret_cast<uintptr_t>(buffer_), &flags)) << "not a block";
  EXPECT_EQ(flags, 77u);
  ReleaseWait wait;
  EXPECT_EQ(host->Free(reinterpret_cast<uintptr_t>(block), primary_, &wait), CUDA_SUCCESS);
}

// A free as the pool's unregister: on any thread, after the wait for the
// context's work; a second free is the driver's error.
TEST_F(CudaPoolDriverTest, HostFreeWaitsThenFreesOnAnyThread) {
  void* block = nullptr;
  ASSERT_EQ(sim_->cuMemHostAlloc(&block, kBytes, 0), CUDA_SUCCESS);
  const uintptr_t ptr = reinterpret_cast<uintptr_t>(block);
  auto host = MakeCudaHostAllocDriver();
  Queue(stream_, &work_, kWorkNs);
  ReleaseWait wait;
  int result = -1, again = -1;
  int64_t start = 0;
  std::thread([&] {
    start = MonotonicNs();
    result = host->Free(ptr, primary_, &wait);
    ReleaseWait second;
    again = host->Free(ptr, primary_, &second);
  }).join();
  EXPECT_EQ(result, CUDA_SUCCESS);
  EXPECT_FALSE(wait.forced);
  EXPECT_GE(wait.waited_ns, work_.until_ns - start);
  EXPECT_EQ(again, CUDA_ERROR_INVALID_VALUE);
}

TEST_F(CudaPoolDriverTest, HostFreeUnderCaptureKeepsTheCapture) {
  void* block = nullptr;
  ASSERT_EQ(sim_->cuMemHostAlloc(&block, kBytes, 0), CUDA_SUCCESS);
  auto host = MakeCudaHostAllocDriver();
  BeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL);
  ReleaseWait wait;
  EXPECT_EQ(host->Free(reinterpret_cast<uintptr_t>(block), primary_, &wait), CUDA_SUCCESS);
  EXPECT_TRUE(wait.forced);
  EXPECT_EQ(EndCapture(stream_), CUDA_SUCCESS);
}

TEST_F(CudaPoolDriverTest, HostProtectTogglesAccess) {
  auto host = MakeCudaHostAllocDriver();
  const uintptr_t ptr = reinterpret_cast<uintptr_t>(buffer_);
  ASSERT_TRUE(Accessible(buffer_, 4096));
  host->Protect(ptr, kBytes, false);
  EXPECT_FALSE(Accessible(buffer_, 4096));
  EXPECT_FALSE(Accessible(buffer_ + kBytes - 4096, 4096));
  host->Protect(ptr, kBytes, true);
  EXPECT_TRUE(Accessible(buffer_, 4096));
  buffer_[kBytes - 1] = 1;
}

// -------------------------------------------- admission, frames, clocks ----
// Without defer_shared, shared pages are passed (kShared); private anonymous
// ones may be deferred. Without a watch, nothing is kUnwatched.
TEST_F(CudaPoolDriverTest, AdmitPassesSharedPagesUnlessAllowed) {
  void* shared = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(shared, MAP_FAILED);
  const uintptr_t lo = reinterpret_cast<uintptr_t>(shared);
  const uintptr_t mine = reinterpret_cast<uintptr_t>(buffer_);
  auto strict = MakeCudaPoolDriver(nullptr, /*defer_shared=*/false, 0);
  EXPECT_EQ(strict->Admit(lo, lo + kBytes), PassReason::kShared);
  EXPECT_EQ(strict->Admit(mine, mine + kBytes), PassReason::kNone);
  EXPECT_EQ(driver_->Admit(lo, lo + kBytes), PassReason::kNone) << "defer_shared";
  munmap(shared, kBytes);
}

TEST_F(CudaPoolDriverTest, ReadFramesNamesPresentPages) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  ASSERT_LE(2 * page, kBytes);
  buffer_[0] = 1;  // the first page present, the second never touched
  std::vector<uint64_t> frames;
  if (!driver_->ReadFrames(reinterpret_cast<uintptr_t>(buffer_), 2 * page, &frames)) {
    GTEST_SKIP() << "pagemap hides frame numbers here";
  }
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_NE(frames[0], 0u);
  EXPECT_EQ(frames[1], 0u);
}

TEST_F(CudaPoolDriverTest, ClocksAreOneMonotonicClock) {
  const int64_t before = MonotonicNs();
  const int64_t now = driver_->NowNs();
  const int64_t age = driver_->AgeClockNs();
  const int64_t after = MonotonicNs();
  EXPECT_GE(now, before);
  EXPECT_LE(now, after);
  EXPECT_LE(age, after);
  EXPECT_GT(age, before - 50 * 1000000) << "coarse, not another clock";
}

// ------------------------------------------------------ several devices ----
class CudaPoolDriverTwoDevicesTest : public CudaPoolDriverTest {
 protected:
  int Devices() const override { return 2; }
  std::vector<Context> Others(Context own) {
    Context out[kMaxDevices];
    const int n = OtherDeviceContexts(own, out, kMaxDevices);
    return std::vector<Context>(out, out + n);
  }
};

TEST_F(CudaPoolDriverTwoDevicesTest, DeviceCountIsTheDriversAndPrimaryContextsPerDevice) {
  EXPECT_EQ(DeviceCount(), 2);
  EXPECT_EQ(ActivePrimaryContext(0), primary_);
  EXPECT_EQ(ActivePrimaryContext(1), primary1_);
  EXPECT_EQ(ActivePrimaryContext(2), nullptr);
}

// The other devices' active primary contexts, never the own context, each
// once; and every other context the driver has a waiter for.
TEST_F(CudaPoolDriverTwoDevicesTest, OtherDeviceContextsNamesWhatTheWaitCovers) {
  std::vector<Context> others = Others(primary_);
  EXPECT_THAT(others, Contains(primary1_).Times(1));
  EXPECT_THAT(others, Not(Contains(primary_)));
  others = Others(primary1_);
  EXPECT_THAT(others, Contains(primary_).Times(1));
  EXPECT_THAT(others, Not(Contains(primary1_)));

  CUcontext created = nullptr;
  ASSERT_EQ(sim_->cuCtxCreate_v4(&created, nullptr, 0, 1), CUDA_SUCCESS);  // pushed
  EXPECT_THAT(Others(primary_), Not(Contains(created))) << "no waiter yet";
  driver_->PrepareRelease(created);
  EXPECT_THAT(Others(primary_), Contains(created).Times(1));
  EXPECT_THAT(Others(created), Contains(primary_).Times(1));
  EXPECT_EQ(CurrentOnThisThread(), created) << "asking left the stack as it was";
  ASSERT_EQ(sim_->cuCtxDestroy_v2(created), CUDA_SUCCESS);
  Context out[1];
  EXPECT_EQ(OtherDeviceContexts(primary_, out, 1), 1) << "at most `max`";
}

// The driver's unregister waits for every device's work: lazypin's wait
// before it covers the other device's too.
TEST_F(CudaPoolDriverTwoDevicesTest, UnregisterWaitsForTheOtherDevicesWork) {
  const uintptr_t ptr = Register();
  driver_->PrepareRelease(primary_);
  Queue(stream1_, &other_work_, kWorkNs);
  const int64_t start = MonotonicNs();
  ReleaseWait wait;
  EXPECT_EQ(driver_->Unregister(ptr, primary_, &wait), CUDA_SUCCESS);
  EXPECT_FALSE(wait.forced);
  EXPECT_GE(wait.waited_ns, other_work_.until_ns - start);
}

// A context destroyed since its waiter was made has no work left: neither
// the release's wait nor the program's wait is missed or failed for it.
TEST_F(CudaPoolDriverTwoDevicesTest, DestroyedContextsHaveNothingToWaitFor) {
  CUcontext created = nullptr;
  ASSERT_EQ(sim_->cuCtxCreate_v4(&created, nullptr, 0, 1), CUDA_SUCCESS);
  driver_->PrepareRelease(created);
  ASSERT_EQ(sim_->cuCtxDestroy_v2(created), CUDA_SUCCESS);  // popped
  ASSERT_EQ(CurrentOnThisThread(), primary_);
  const uintptr_t ptr = Register();
  driver_->PrepareRelease(primary_);
  ReleaseWait wait;
  EXPECT_EQ(driver_->Unregister(ptr, primary_, &wait), CUDA_SUCCESS);
  EXPECT_FALSE(wait.forced);
  EXPECT_EQ(Env().WaitForDevice(primary_), CUDA_SUCCESS);
}

// ------------------------------------------------------- before cuInit ----
// Before cuInit the driver cannot count its devices (3): one until it can,
// then its count.
TEST(CudaPoolDriverInitTest, DeviceCountIsOneUntilTheDriverCounts) {
  if (DriverLoaded()) GTEST_SKIP() << "needs a process without libcuda.so.1";
  const Sim* sim = LoadSim(2, /*init=*/false);
  ASSERT_NE(sim, nullptr);
  EXPECT_EQ(DeviceCount(), 1);
  ASSERT_EQ(sim->cuInit(0), CUDA_SUCCESS);
  EXPECT_EQ(DeviceCount(), 2);
}

}  // namespace
}  // namespace lazypin
