// cuda_env: the CUDA side of DispatchEnv (see cuda_env.h).
#include "cuda_env.h"

#include <algorithm>

#include "capture.h"
#include "cuda.h"
#include "cuda_pool_driver.h"
#include "real.h"

namespace lazypin {
namespace {

real::Lazy<CUresult (*)(CUcontext*)> g_ctx_get_current;
real::Lazy<CUresult (*)(CUdevice*)> g_ctx_get_device;
real::Lazy<CUresult (*)(int*)> g_driver_get_version;
real::Lazy<CUresult (*)()> g_ctx_synchronize;
real::Lazy<CUresult (*)(CUcontext)> g_ctx_push;
real::Lazy<CUresult (*)(CUcontext*)> g_ctx_pop;
real::Lazy<CUresult (*)(CUdevice, unsigned*, int*)> g_primary_get_state;
real::Lazy<CUresult (*)(CUstream, CUstreamCaptureStatus*)> g_stream_is_capturing;
real::Lazy<CUresult (*)(CUstream)> g_stream_synchronize;
real::Lazy<CUresult (*)(CUstream)> g_stream_query;
real::Lazy<CUresult (*)(CUstream, unsigned*)> g_stream_get_flags;
real::Lazy<CUresult (*)(CUstreamCaptureMode*)> g_capture_mode;

}  // namespace

Context CudaEnv::CurrentContext() {
  CUcontext ctx = nullptr;
  if (auto get = g_ctx_get_current.Get(&real::Driver, "cuCtxGetCurrent")) get(&ctx);
  return ctx;
}

int CudaEnv::CurrentDevice() {
  CUdevice device = -1;
  auto get = g_ctx_get_device.Get(&real::Driver, "cuCtxGetDevice");
  if (get == nullptr || get(&device) != CUDA_SUCCESS) device = -1;
  return device;
}

bool CudaEnv::CaptureForbidsDeferral() {
  if (!Captures().Any()) return false;
  auto exchange = g_capture_mode.Get(&real::Driver, "cuThreadExchangeStreamCaptureMode");
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
  auto synchronize = g_ctx_synchronize.Get(&real::Driver, "cuCtxSynchronize");
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
  auto push = g_ctx_push.Get(&real::Driver, "cuCtxPushCurrent_v2");
  auto pop = g_ctx_pop.Get(&real::Driver, "cuCtxPopCurrent_v2");
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
  return DeviceCount() > 1 ? std::min(CurrentDevice(), 127) : -1;
}

bool CudaEnv::PrimaryContextActive(int device) {
  auto get_state = g_primary_get_state.Get(&real::Driver, "cuDevicePrimaryCtxGetState");
  unsigned flags = 0;
  int active = 0;
  return get_state != nullptr && get_state(device, &flags, &active) == CUDA_SUCCESS && active != 0;
}

void CudaEnv::SynchronizeStream(void* stream) {
  auto is_capturing = g_stream_is_capturing.Get(&real::Driver, "cuStreamIsCapturing");
  auto synchronize = g_stream_synchronize.Get(&real::Driver, "cuStreamSynchronize");
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
  auto query = g_stream_query.Get(&real::Driver, "cuStreamQuery");
  auto get_flags = g_stream_get_flags.Get(&real::Driver, "cuStreamGetFlags");
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
  auto get_version = g_driver_get_version.Get(&real::Driver, "cuDriverGetVersion");
  if (get_version == nullptr || get_version(&version) != CUDA_SUCCESS) version = 0;
  return version;
}

}  // namespace lazypin
