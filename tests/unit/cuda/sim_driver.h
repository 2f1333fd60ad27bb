// sim_driver: the simulated driver (tests/simcuda) for the cuda layer's
// tests, loaded at run time as a program's runtime loads libcuda.so.1, and
// work that holds a stream busy.
//
// The driver reads its device count once per process, and each test is run
// in a process of its own (ctest): LoadSim answers null where the driver
// already loaded in this process has another count.
#pragma once

#include <dlfcn.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

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

// CudaEnv as the runtime completes it (where a call's record goes), here nowhere.
class Env : public CudaEnv {
 public:
  void Record(const CallRecord&) override {}
};

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

}  // namespace sim_driver
}  // namespace lazypin
