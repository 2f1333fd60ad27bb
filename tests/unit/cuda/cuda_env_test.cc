// CudaEnv (shim/cuda/cuda_env.h): dispatch's view of the CUDA driver, against
// the simulated driver (tests/simcuda), loaded at run time as a program's
// runtime loads libcuda.so.1: the current context and its device, the capture
// rule, the one wait lazypin makes for the program, primary-context state, the
// pageable-copy stream wait and the stream-idle question, and what each
// answers while no driver is loaded.
#include "cuda_env.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "capture.h"
#include "cuda.h"
#include "sim_driver.h"
#include "sys.h"

namespace lazypin {
namespace {

using namespace sim_driver;  // NOLINT: the tests' own helpers

class CudaEnvTest : public SimDriverTest {
 protected:
  // The fixture's stream, its context on this thread and its retain of
  // device 0's primary context, undone.
  void ReleasePrimary() {
    ASSERT_EQ(sim_->cuStreamDestroy_v2(stream_), CUDA_SUCCESS);
    stream_ = nullptr;
    CUcontext popped;
    ASSERT_EQ(sim_->cuCtxPopCurrent_v2(&popped), CUDA_SUCCESS);
    pushed_ = false;
    ASSERT_EQ(sim_->cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
  }

  Env env_;
};

// ------------------------------------------------------------ no driver ----
// Without a loaded libcuda every answer is the "unknown" one its contract
// names; nothing loads the driver. (A test of its own: the driver, once
// loaded, stays.)
TEST(CudaEnvNoDriverTest, AnswersUnknownWithoutLoadingTheDriver) {
  if (DriverLoaded()) GTEST_SKIP() << "needs a process without libcuda.so.1";
  Env env;
  EXPECT_EQ(env.CurrentContext(), nullptr);
  EXPECT_EQ(env.DeviceOf(nullptr), -1);
  EXPECT_FALSE(env.PrimaryContextActive(0));
  EXPECT_EQ(env.ActivePrimaryContext(0), nullptr);
  EXPECT_EQ(env.RecordedDevice(), -1);
  EXPECT_FALSE(env.StreamIdle(nullptr));
  EXPECT_EQ(env.DriverVersion(), 0);
  EXPECT_EQ(env.WaitForDevice(reinterpret_cast<Context>(0x10)), kCudaNotInitialized);
  EXPECT_FALSE(env.CaptureForbidsDeferral()) << "nothing captures";
  EXPECT_FALSE(DriverLoaded());
}

// A capture in progress whose thread mode cannot be asked: forwarded.
TEST(CudaEnvNoDriverTest, UnknownCaptureModeForbidsDeferral) {
  if (DriverLoaded()) GTEST_SKIP() << "needs a process without libcuda.so.1";
  Env env;
  const Context ctx = reinterpret_cast<Context>(0x10);
  Captures().Begin(0x5000, ctx, CaptureMode::kRelaxed, CaptureThreadId());
  EXPECT_TRUE(env.CaptureForbidsDeferral());
  Captures().Ended(0x5000);
  EXPECT_FALSE(env.CaptureForbidsDeferral());
}

// ------------------------------------------------------- one device ----
TEST_F(CudaEnvTest, DriverVersionIsTheDriversAnswer) { EXPECT_EQ(env_.DriverVersion(), 13000); }

TEST_F(CudaEnvTest, CurrentContextFollowsTheThreadsStack) {
  EXPECT_EQ(env_.CurrentContext(), primary_);
  CUcontext created = nullptr;
  ASSERT_EQ(sim_->cuCtxCreate_v4(&created, nullptr, 0, 0), CUDA_SUCCESS);  // pushed
  EXPECT_EQ(env_.CurrentContext(), created);
  ASSERT_EQ(sim_->cuCtxDestroy_v2(created), CUDA_SUCCESS);  // popped
  EXPECT_EQ(env_.CurrentContext(), primary_);

  // Another thread has none current.
  Context seen = primary_;
  std::thread([&] { seen = Env().CurrentContext(); }).join();
  EXPECT_EQ(seen, nullptr);
}

TEST_F(CudaEnvTest, OneDeviceIsDeviceZeroWithoutAskingAndNotRecorded) {
  EXPECT_EQ(env_.DeviceOf(nullptr), -1);
  EXPECT_EQ(env_.DeviceOf(primary_), 0);
  // Not asked: a thread with no context current (where the driver would
  // answer 201) still gets 0.
  int device = -1;
  std::thread([&] { device = Env().DeviceOf(primary_); }).join();
  EXPECT_EQ(device, 0);
  EXPECT_EQ(env_.RecordedDevice(), -1);
}

TEST_F(CudaEnvTest, PrimaryContextActiveFollowsRetainAndRelease) {
  EXPECT_TRUE(env_.PrimaryContextActive(0)) << "retained by the fixture";
  EXPECT_FALSE(env_.PrimaryContextActive(1)) << "no such device: unknown";
  EXPECT_FALSE(env_.PrimaryContextActive(-1));
  ReleasePrimary();  // to 0: destroyed
  primary_ = nullptr;
  EXPECT_FALSE(env_.PrimaryContextActive(0));
  CUcontext again = nullptr;
  ASSERT_EQ(sim_->cuDevicePrimaryCtxRetain(&again, 0), CUDA_SUCCESS);
  primary_ = again;
  EXPECT_TRUE(env_.PrimaryContextActive(0));
}

// Learned without changing the state: an active context keeps its count (one
// release still destroys it) and an inactive one stays inactive.
TEST_F(CudaEnvTest, ActivePrimaryContextLeavesTheStateAsItWas) {
  EXPECT_EQ(env_.ActivePrimaryContext(0), primary_);
  EXPECT_EQ(env_.ActivePrimaryContext(0), primary_);
  EXPECT_EQ(env_.ActivePrimaryContext(1), nullptr) << "no such device";
  ReleasePrimary();
  primary_ = nullptr;
  EXPECT_FALSE(env_.PrimaryContextActive(0)) << "the fixture's retain was the only one";
  EXPECT_EQ(env_.ActivePrimaryContext(0), nullptr);
  EXPECT_FALSE(env_.PrimaryContextActive(0)) << "asking did not retain it";
}

TEST_F(CudaEnvTest, NoCaptureNeverForbidsDeferral) {
  ASSERT_FALSE(Captures().Any());
  EXPECT_FALSE(env_.CaptureForbidsDeferral());
}

// A global-mode capture forbids this thread's unregister in the default
// (global) mode, as the driver's own refusal (900) shows; the thread's mode
// is left as it was.
TEST_F(CudaEnvTest, GlobalCaptureForbidsDeferralInGlobalMode) {
  BeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL);
  EXPECT_TRUE(env_.CaptureForbidsDeferral());
  EXPECT_EQ(ThreadCaptureMode(), CU_STREAM_CAPTURE_MODE_GLOBAL);
  char buffer[4096];
  ASSERT_EQ(sim_->cuMemHostRegister_v2(buffer, sizeof buffer, 0), CUDA_SUCCESS);
  EXPECT_EQ(sim_->cuMemHostUnregister(buffer), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_EQ(EndCapture(stream_), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(sim_->cuMemHostUnregister(buffer), CUDA_SUCCESS);
}

// In relaxed mode the same thread may unregister, and the driver lets it
// (the capture survives).
TEST_F(CudaEnvTest, RelaxedThreadMayDeferUnderGlobalCapture) {
  BeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL);
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  ASSERT_EQ(sim_->cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
  EXPECT_FALSE(env_.CaptureForbidsDeferral());
  EXPECT_EQ(ThreadCaptureMode(), CU_STREAM_CAPTURE_MODE_RELAXED) << "left as it was";
  char buffer[4096];
  ASSERT_EQ(sim_->cuMemHostRegister_v2(buffer, sizeof buffer, 0), CUDA_SUCCESS);
  EXPECT_EQ(sim_->cuMemHostUnregister(buffer), CUDA_SUCCESS);
  sim_->cuThreadExchangeStreamCaptureMode(&mode);
  EXPECT_EQ(EndCapture(stream_), CUDA_SUCCESS);
}

// A relaxed capture forbids nothing; a thread-local one forbids its own
// thread's unregister (global or thread-local mode), not another thread's.
TEST_F(CudaEnvTest, CaptureModesAsTheDriverRulesThem) {
  BeginCapture(stream_, CU_STREAM_CAPTURE_MODE_RELAXED);
  EXPECT_FALSE(env_.CaptureForbidsDeferral());
  EXPECT_EQ(EndCapture(stream_), CUDA_SUCCESS);

  BeginCapture(stream_, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  EXPECT_TRUE(env_.CaptureForbidsDeferral());
  bool other_forbidden = true;
  std::thread([&] { other_forbidden = Env().CaptureForbidsDeferral(); }).join();
  EXPECT_FALSE(other_forbidden);
  EXPECT_EQ(EndCapture(stream_), CUDA_SUCCESS) << "asking invalidated nothing";
}

// The wait returns once the work in flight in the context has finished.
TEST_F(CudaEnvTest, WaitForDeviceWaitsForTheWorkInFlight) {
  Queue(stream_, &work_, kWorkNs);
  EXPECT_EQ(env_.WaitForDevice(primary_), CUDA_SUCCESS);
  EXPECT_TRUE(work_.done.load());
  EXPECT_EQ(sim_->cuStreamQuery(stream_), CUDA_SUCCESS);
  EXPECT_EQ(env_.CurrentContext(), primary_);
}

// A capture in progress in the context: no synchronize (it would invalidate
// the capture, even in relaxed mode), 900.
TEST_F(CudaEnvTest, WaitForDeviceDoesNotSynchronizeUnderCapture) {
  BeginCapture(stream_, CU_STREAM_CAPTURE_MODE_RELAXED);
  EXPECT_EQ(env_.WaitForDevice(primary_), kCudaCaptureUnsupported);
  EXPECT_EQ(CaptureStatus(stream_), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_EQ(EndCapture(stream_), CUDA_SUCCESS);
}

// No context current: the driver's answer (201), not a wait.
TEST_F(CudaEnvTest, WaitForDeviceReturnsTheDriversResult) {
  int result = 0;
  std::thread([&] { result = Env().WaitForDevice(nullptr); }).join();
  EXPECT_EQ(result, CUDA_ERROR_INVALID_CONTEXT);
}

TEST_F(CudaEnvTest, SynchronizeStreamWaitsForItsWork) {
  Queue(stream_, &work_, kWorkNs);
  env_.SynchronizeStream(stream_);
  EXPECT_TRUE(work_.done.load());
  EXPECT_EQ(sim_->cuStreamQuery(stream_), CUDA_SUCCESS);
}

// A capturing stream ran nothing: left alone (a synchronize would
// invalidate the capture).
TEST_F(CudaEnvTest, SynchronizeStreamLeavesACapturingStream) {
  BeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL);
  env_.SynchronizeStream(stream_);
  EXPECT_EQ(CaptureStatus(stream_), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_EQ(EndCapture(stream_), CUDA_SUCCESS);
}

TEST_F(CudaEnvTest, StreamIdleFollowsTheStreamsWork) {
  EXPECT_TRUE(env_.StreamIdle(stream_));
  EXPECT_TRUE(env_.StreamIdle(nullptr));
  EXPECT_TRUE(env_.StreamIdle(CU_STREAM_LEGACY));
  Queue(stream_, &work_);
  EXPECT_FALSE(env_.StreamIdle(stream_));
  work_.Finish();
  env_.SynchronizeStream(stream_);
  EXPECT_TRUE(env_.StreamIdle(stream_));
}

// A blocking stream's copy waits for the legacy stream's work too; a
// non-blocking stream's does not. The null stream is the legacy one.
TEST_F(CudaEnvTest, StreamIdleCountsTheLegacyStreamUnlessNonBlocking) {
  CUstream non_blocking = nullptr;
  ASSERT_EQ(sim_->cuStreamCreate(&non_blocking, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  Queue(CU_STREAM_LEGACY, &work_);
  EXPECT_EQ(sim_->cuStreamQuery(stream_), CUDA_SUCCESS) << "the stream itself is idle";
  EXPECT_FALSE(env_.StreamIdle(stream_));
  EXPECT_FALSE(env_.StreamIdle(nullptr));
  EXPECT_FALSE(env_.StreamIdle(CU_STREAM_LEGACY));
  EXPECT_TRUE(env_.StreamIdle(non_blocking));
  work_.Finish();
  env_.SynchronizeStream(CU_STREAM_LEGACY);
  EXPECT_TRUE(env_.StreamIdle(stream_));
  sim_->cuStreamDestroy_v2(non_blocking);
}

// Any capture in progress: false without a query (a query of a capturing
// stream would invalidate it).
TEST_F(CudaEnvTest, StreamIdleIsFalseWhileAnythingCaptures) {
  BeginCapture(stream_, CU_STREAM_CAPTURE_MODE_RELAXED);
  EXPECT_FALSE(env_.StreamIdle(stream_));
  EXPECT_EQ(CaptureStatus(stream_), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_EQ(EndCapture(stream_), CUDA_SUCCESS);
  EXPECT_TRUE(env_.StreamIdle(stream_));
}

// ------------------------------------------------------ several devices ----
class CudaEnvTwoDevicesTest : public CudaEnvTest {
 protected:
  int Devices() const override { return 2; }
};

TEST_F(CudaEnvTwoDevicesTest, DeviceOfAndRecordedDeviceNameTheCurrentContexts) {
  EXPECT_EQ(env_.DeviceOf(primary_), 0);
  EXPECT_EQ(env_.RecordedDevice(), 0);
  ASSERT_EQ(sim_->cuCtxPushCurrent_v2(primary1_), CUDA_SUCCESS);
  EXPECT_EQ(env_.DeviceOf(primary1_), 1);
  EXPECT_EQ(env_.RecordedDevice(), 1);
  CUcontext popped;
  sim_->cuCtxPopCurrent_v2(&popped);
  EXPECT_EQ(env_.DeviceOf(nullptr), -1);
}

TEST_F(CudaEnvTwoDevicesTest, PrimaryContextStatePerDevice) {
  EXPECT_TRUE(env_.PrimaryContextActive(1));
  EXPECT_EQ(env_.ActivePrimaryContext(1), primary1_);
  EXPECT_NE(primary1_, primary_);
  EXPECT_FALSE(env_.PrimaryContextActive(2)) << "no such device";
  ASSERT_EQ(sim_->cuStreamDestroy_v2(stream1_), CUDA_SUCCESS);
  stream1_ = nullptr;
  ASSERT_EQ(sim_->cuDevicePrimaryCtxRelease_v2(1), CUDA_SUCCESS);
  primary1_ = nullptr;
  EXPECT_FALSE(env_.PrimaryContextActive(1));
  EXPECT_EQ(env_.ActivePrimaryContext(1), nullptr);
  EXPECT_TRUE(env_.PrimaryContextActive(0)) << "the other device keeps its own";
}

// The driver's wait covers every device: so does this one, through the other
// devices' active primary contexts, and the current context stays current.
TEST_F(CudaEnvTwoDevicesTest, WaitForDeviceCoversTheOtherDevices) {
  Queue(stream1_, &other_work_, kWorkNs);
  EXPECT_EQ(env_.WaitForDevice(primary_), CUDA_SUCCESS);
  EXPECT_TRUE(other_work_.done.load());
  EXPECT_EQ(env_.CurrentContext(), primary_);
  CUcontext popped = nullptr;
  ASSERT_EQ(sim_->cuCtxPopCurrent_v2(&popped), CUDA_SUCCESS);
  EXPECT_EQ(popped, primary_);
  CUcontext below = nullptr;
  EXPECT_EQ(sim_->cuCtxGetCurrent(&below), CUDA_SUCCESS);
  EXPECT_EQ(below, nullptr) << "every push undone";
  ASSERT_EQ(sim_->cuCtxPushCurrent_v2(primary_), CUDA_SUCCESS);
}

// A capture in progress in another device's context: no wait there or here.
TEST_F(CudaEnvTwoDevicesTest, WaitForDeviceDoesNotSynchronizeAnotherDevicesCapture) {
  ASSERT_EQ(sim_->cuCtxPushCurrent_v2(primary1_), CUDA_SUCCESS);
  BeginCapture(stream1_, CU_STREAM_CAPTURE_MODE_RELAXED);
  CUcontext popped;
  sim_->cuCtxPopCurrent_v2(&popped);
  EXPECT_EQ(env_.WaitForDevice(primary_), kCudaCaptureUnsupported);
  EXPECT_EQ(CaptureStatus(stream1_), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_EQ(EndCapture(stream1_), CUDA_SUCCESS);
  EXPECT_EQ(env_.WaitForDevice(primary_), CUDA_SUCCESS);
}

}  // namespace
}  // namespace lazypin
