// cuda_env: the CUDA side of DispatchEnv (see cuda_env.h).
#include "cuda_env.h"

#include <algorithm>

#include "capture.h"
#include "cuda_pool_driver.h"
#include "driver_calls.h"

namespace lazypin {
Context CudaEnv::CurrentContext() {
  CUcontext ctx = nullptr;
  if (auto get = driver::CtxGetCurrent()) get(&ctx);
  return ctx;
}

int CudaEnv::DeviceOf(Context ctx) {
  if (ctx == nullptr) return -1;
  if (DeviceCount() == 1) return 0;
  CUdevice device = -1;
  auto get = driver::CtxGetDevice();
  if (get == nullptr || get(&device) != CUDA_SUCCESS) device = -1;
  return device;
}

bool CudaEnv::CaptureForbidsDeferral() {
  if (!Captures().Any()) return false;
  auto exchange = driver::ExchangeCaptureMode();
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  // Unknown: forward (the driver's own answer is always the bare one).
  if (exchange == nullptr || exchange(&mode) != CUDA_SUCCESS) return true;
  CUstreamCaptureMode restore = mode;
  exchange(&restore);
  return Captures().ForbidsUnsafeCall(CaptureThreadId(), static_cast<CaptureMode>(mode));
}

int CudaEnv::WaitForDevice(Context ctx) {
  // A synchronize would invalidate a capture in progress in the context,
  // even in relaxed mode: then no wait, and the unregister is forwarded.
  if (Captures().InProgress(ctx)) return kCudaCaptureUnsupported;
  // `ctx` is current on this thread: cuCtxSynchronize waits for it alone.
  auto synchronize = driver::CtxSynchronize();
  if (synchronize == nullptr) return kCudaNotInitialized;
  // Several devices: the driver's wait covers every device's work, so this
  // one waits for the other devices' active primary contexts and the other
  // contexts lazypin knows too, each pushed on this thread
  // (cuda_pool_driver.h). A capture in progress in one of them: no wait,
  // forwarded.
  Context others[kMaxDevices];
  const int n = DeviceCount() > 1 ? OtherDeviceContexts(ctx, others, kMaxDevices) : 0;
  for (int i = 0; i < n; ++i) {
    if (Captures().InProgress(others[i])) return kCudaCaptureUnsupported;
  }
  const int result = synchronize();
  if (result != CUDA_SUCCESS || n == 0) return result;
  auto push = driver::CtxPushCurrent();
  auto pop = driver::CtxPopCurrent();
  if (push == nullptr || pop == nullptr) return kCudaNotInitialized;
  for (int i = 0; i < n; ++i) {
    // A context destroyed meanwhile has no work left to wait for.
    if (push(static_cast<CUcontext>(others[i])) != CUDA_SUCCESS) continue;
    const int other = synchronize();
    CUcontext popped;
    pop(&popped);
    if (other != CUDA_SUCCESS && other != CUDA_ERROR_CONTEXT_IS_DESTROYED) return other;
  }
  return result;
}

Context CudaEnv::ActivePrimaryContext(int device) { return lazypin::ActivePrimaryContext(device); }

int CudaEnv::RecordedDevice() {
  // One relaxed load with one device.
  return DeviceCount() > 1 ? std::min(DeviceOf(CurrentContext()), 127) : -1;
}

bool CudaEnv::PrimaryContextActive(int device) {
  auto get_state = driver::PrimaryCtxGetState();
  unsigned flags = 0;
  int active = 0;
  return get_state != nullptr && get_state(device, &flags, &active) == CUDA_SUCCESS && active != 0;
}

void CudaEnv::SynchronizeStream(void* stream) {
  auto is_capturing = driver::StreamIsCapturing();
  auto synchronize = driver::StreamSynchronize();
  if (is_capturing == nullptr || synchronize == nullptr) return;
  // A capturing stream ran nothing (the copy was recorded), and synchronizing
  // it would invalidate the capture: leave it, as for an unknown status.
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  const CUstream s = static_cast<CUstream>(stream);
  if (is_capturing(s, &status) != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE) return;
  synchronize(s);
}

bool CudaEnv::StreamIdle(void* stream) {
  if (Captures().Any()) return false;
  auto query = driver::StreamQuery();
  auto get_flags = driver::StreamGetFlags();
  const CUstream s = static_cast<CUstream>(stream);
  if (query == nullptr || get_flags == nullptr || query(s) != CUDA_SUCCESS) return false;
  // A blocking stream's copy also waits for the legacy default stream's work.
  unsigned flags = 0;
  if (s != nullptr && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD &&
      get_flags(s, &flags) == CUDA_SUCCESS && (flags & CU_STREAM_NON_BLOCKING) != 0) {
    return true;
  }
  return s == CU_STREAM_LEGACY || query(CU_STREAM_LEGACY) == CUDA_SUCCESS;
}

int CudaEnv::DriverVersion() {
  int version = 0;
  auto get_version = driver::DriverGetVersion();
  if (get_version == nullptr || get_version(&version) != CUDA_SUCCESS) version = 0;
  return version;
}

}  // namespace lazypin
