// sim_driver: the simulated driver (tests/simcuda) for the cuda layer's
// tests, loaded at run time as a program's runtime loads libcuda.so.1, work
// that holds a stream busy, and the fixture those tests share.
//
// The driver reads its device count once per process, and each test is run
// in a process of its own (ctest): LoadSim answers null where the driver
// already loaded in this process has another count.
#pragma once

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
#include "cuda_env.h"
#include "sys.h"

namespace lazypin {
namespace sim_driver {

// The simulated driver's entry points the tests drive directly.
#define SIM_CALLS(X)                                                                             \
  X(cuInit) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease_v2) X(cuCtxSetCurrent)      \
  X(cuCtxGetCurrent) X(cuCtxCreate_v4) X(cuCtxDestroy_v2) X(cuCtxPushCurrent_v2)                 \
  X(cuCtxPopCurrent_v2) X(cuStreamCreate) X(cuStreamDestroy_v2) X(cuStreamQuery)                 \
  X(cuStreamIsCapturing) X(cuStreamBeginCapture_v2) X(cuStreamEndCapture) X(cuGraphDestroy)     \
  X(cuLaunchHostFunc) X(cuThreadExchangeStreamCaptureMode) X(cuMemHostRegister_v2)              \
  X(cuMemHostUnregister) X(cuMemHostAlloc)

struct Sim {
#define SIM_FIELD(name) decltype(&::name) name = nullptr;
  SIM_CALLS(SIM_FIELD)
#undef SIM_FIELD
  int (*device_count)() = nullptr;                  // simcuda_device_count
  unsigned long (*live_registrations)() = nullptr;  // simcuda_live_registrations
};

using Env = CudaEnv;

inline bool DriverLoaded() {
  void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (h != nullptr) dlclose(h);
  return h != nullptr;
}

// The simulated driver with `devices` devices, loaded and (with `init`)
// initialized; null when this process already has it with another device count.
inline const Sim* LoadSim(int devices, bool init = true) {
  static Sim sim;
  static void* handle = nullptr;
  if (handle == nullptr) {
    setenv("SIMCUDA_DEVICES", std::to_string(devices).c_str(), 1);
    setenv("SIMCUDA_SLEEP", "0", 1);  // no simulated durations: work is what the tests queue
    setenv("SIMCUDA_PIN", "0", 1);
    handle = dlopen(SIMCUDA_DRIVER, RTLD_NOW | RTLD_GLOBAL);
    if (handle == nullptr) return nullptr;
#define SIM_RESOLVE(name) sim.name = reinterpret_cast<decltype(&::name)>(dlsym(handle, #name));
    SIM_CALLS(SIM_RESOLVE)
#undef SIM_RESOLVE
    sim.device_count = reinterpret_cast<int (*)()>(dlsym(handle, "simcuda_device_count"));
    sim.live_registrations =
        reinterpret_cast<unsigned long (*)()>(dlsym(handle, "simcuda_live_registrations"));
  }
  if (sim.device_count() != devices) return nullptr;
  if (init && sim.cuInit(0) != CUDA_SUCCESS) return nullptr;
  return &sim;
}

// Work on a stream that runs until released or until `until_ns` (a kernel
// still running): the stream, and whatever waits for it, waits meanwhile.
struct Work {
  std::atomic<bool> release{false};
  std::atomic<bool> done{false};
  int64_t until_ns = INT64_MAX;
  bool queued = false;

  static void Run(void* p) {
    auto* w = static_cast<Work*>(p);
    while (!w->release.load() && MonotonicNs() < w->until_ns) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    w->done.store(true);
  }
  // Lets it finish and waits until it has.
  void Finish() {
    release.store(true);
    while (queued && !done.load()) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
};

constexpr int64_t kWorkNs = 200 * 1000000;  // long enough that a missing wait is seen

// A test against the simulated driver with Devices() devices: device 0's
// primary context retained and current on the test's thread, with stream_
// made in it; with two or more devices, device 1's primary context retained
// too (not current), with stream1_ made in it. Skipped where this process's
// driver has another device count. A derived fixture's SetUp calls this one
// first and returns where it skipped or failed; its TearDown calls EndWork
// before releasing what needs no capture in progress, and this TearDown last.
class SimDriverTest : public ::testing::Test {
 protected:
  virtual int Devices() const { return 1; }

  void SetUp() override {
    sim_ = LoadSim(Devices());
    if (sim_ == nullptr) {
      GTEST_SKIP() << "needs a process whose driver has " << Devices() << " device(s)";
    }
    ASSERT_EQ(sim_->cuDevicePrimaryCtxRetain(&primary_, 0), CUDA_SUCCESS);
    ASSERT_EQ(sim_->cuCtxPushCurrent_v2(primary_), CUDA_SUCCESS);
    pushed_ = true;
    ASSERT_EQ(sim_->cuStreamCreate(&stream_, 0), CUDA_SUCCESS);
    if (Devices() < 2) return;
    ASSERT_EQ(sim_->cuDevicePrimaryCtxRetain(&primary1_, 1), CUDA_SUCCESS);
    ASSERT_EQ(sim_->cuCtxPushCurrent_v2(primary1_), CUDA_SUCCESS);
    const CUresult made = sim_->cuStreamCreate(&stream1_, 0);
    CUcontext popped;
    sim_->cuCtxPopCurrent_v2(&popped);
    ASSERT_EQ(made, CUDA_SUCCESS);
  }

  // Undoes SetUp, and what EndWork undoes, as far as the test left it.
  void TearDown() override {
    if (sim_ == nullptr) return;
    EndWork();
    if (stream1_ != nullptr) sim_->cuStreamDestroy_v2(stream1_);
    if (primary1_ != nullptr) sim_->cuDevicePrimaryCtxRelease_v2(1);
    if (stream_ != nullptr) sim_->cuStreamDestroy_v2(stream_);
    CUcontext popped;
    if (pushed_) sim_->cuCtxPopCurrent_v2(&popped);
    if (primary_ != nullptr) sim_->cuDevicePrimaryCtxRelease_v2(0);
  }

  // The fixture's work finished and a capture the test left in progress
  // ended, as the driver and the capture hooks see it; a second call does
  // nothing.
  void EndWork() {
    for (Work* w : {&work_, &other_work_}) w->Finish();
    if (tracked_ != nullptr) EndCapture(tracked_);
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (stream_ != nullptr && sim_->cuStreamIsCapturing(stream_, &status) == CUDA_SUCCESS &&
        status != CU_STREAM_CAPTURE_STATUS_NONE) {
      CUgraph graph = nullptr;
      sim_->cuStreamEndCapture(stream_, &graph);
      if (graph != nullptr) sim_->cuGraphDestroy(graph);
    }
  }

  // A capture of `s` (in the current context) as the driver and the capture
  // hooks see it begin.
  void BeginCapture(CUstream s, CUstreamCaptureMode mode) {
    CUcontext ctx = nullptr;
    ASSERT_EQ(sim_->cuCtxGetCurrent(&ctx), CUDA_SUCCESS);
    Captures().Begin(reinterpret_cast<uintptr_t>(s), ctx, static_cast<CaptureMode>(mode),
                     CaptureThreadId());
    tracked_ = s;
    ASSERT_EQ(sim_->cuStreamBeginCapture_v2(s, mode), CUDA_SUCCESS);
  }
  // The capture's end as the driver gives it (901: it was invalidated).
  CUresult EndCapture(CUstream s) {
    CUgraph graph = nullptr;
    const CUresult result = sim_->cuStreamEndCapture(s, &graph);
    if (graph != nullptr) sim_->cuGraphDestroy(graph);
    Captures().Ended(reinterpret_cast<uintptr_t>(s));
    tracked_ = nullptr;
    return result;
  }
  CUstreamCaptureStatus CaptureStatus(CUstream s) {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    EXPECT_EQ(sim_->cuStreamIsCapturing(s, &status), CUDA_SUCCESS);
    return status;
  }
  // This thread's capture mode, left as it was.
  CUstreamCaptureMode ThreadCaptureMode() {
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
    sim_->cuThreadExchangeStreamCaptureMode(&mode);
    CUstreamCaptureMode back = mode;
    sim_->cuThreadExchangeStreamCaptureMode(&back);
    return mode;
  }
  // `w` queued on `s`, running until released or for `for_ns`.
  void Queue(CUstream s, Work* w, int64_t for_ns = INT64_MAX) {
    w->until_ns = for_ns == INT64_MAX ? INT64_MAX : MonotonicNs() + for_ns;
    ASSERT_EQ(sim_->cuLaunchHostFunc(s, &Work::Run, w), CUDA_SUCCESS);
    w->queued = true;
  }
  // The context current on the calling thread.
  Context CurrentOnThisThread() {
    CUcontext ctx = nullptr;
    EXPECT_EQ(sim_->cuCtxGetCurrent(&ctx), CUDA_SUCCESS);
    return ctx;
  }

  const Sim* sim_ = nullptr;
  CUcontext primary_ = nullptr;  // device 0's; null once the test released it
  bool pushed_ = false;          // primary_ is on this thread's stack
  CUstream stream_ = nullptr;
  CUcontext primary1_ = nullptr;  // device 1's, with two or more devices
  CUstream stream1_ = nullptr;
  CUstream tracked_ = nullptr;  // the capture BeginCapture began, until ended
  Work work_;
  Work other_work_;
};

}  // namespace sim_driver
}  // namespace lazypin
