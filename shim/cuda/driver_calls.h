// driver_calls: the real driver functions lazypin calls for itself, one slot
// each, found in the loaded libcuda (real::Driver: never loads it). A hook's
// real functions (one per way the program reached the hook) stay with the
// hook. Each accessor returns the function, or null while no driver is
// loaded; the first call on a thread resolves it (real::Lazy).
#pragma once

#include "cuda.h"
#include "real.h"

namespace lazypin {
namespace driver {

// accessor, symbol, the C function whose type it has
#define LAZYPIN_DRIVER_CALLS(X)                                            \
  X(CtxGetCurrent, cuCtxGetCurrent, cuCtxGetCurrent)                       \
  X(CtxGetDevice, cuCtxGetDevice, cuCtxGetDevice)                          \
  X(CtxSynchronize, cuCtxSynchronize, cuCtxSynchronize)                    \
  X(CtxPushCurrent, cuCtxPushCurrent_v2, cuCtxPushCurrent_v2)              \
  X(CtxPopCurrent, cuCtxPopCurrent_v2, cuCtxPopCurrent_v2)                 \
  X(DeviceGetCount, cuDeviceGetCount, cuDeviceGetCount)                    \
  X(DriverGetVersion, cuDriverGetVersion, cuDriverGetVersion)              \
  X(PrimaryCtxGetState, cuDevicePrimaryCtxGetState, cuDevicePrimaryCtxGetState) \
  X(PrimaryCtxRetain, cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain)  \
  X(PrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRelease_v2) \
  X(ExchangeCaptureMode, cuThreadExchangeStreamCaptureMode, cuThreadExchangeStreamCaptureMode) \
  X(StreamGetCtx, cuStreamGetCtx, cuStreamGetCtx)                          \
  X(StreamGetFlags, cuStreamGetFlags, cuStreamGetFlags)                    \
  X(StreamIsCapturing, cuStreamIsCapturing, cuStreamIsCapturing)           \
  X(StreamIsCapturingPtsz, cuStreamIsCapturing_ptsz, cuStreamIsCapturing)  \
  X(StreamQuery, cuStreamQuery, cuStreamQuery)                             \
  X(StreamSynchronize, cuStreamSynchronize, cuStreamSynchronize)           \
  X(MemGetAddressRange, cuMemGetAddressRange_v2, cuMemGetAddressRange_v2)  \
  X(MemHostRegister, cuMemHostRegister_v2, cuMemHostRegister_v2)           \
  X(MemHostUnregister, cuMemHostUnregister, cuMemHostUnregister)           \
  X(MemFreeHost, cuMemFreeHost, cuMemFreeHost)                             \
  X(MemHostGetFlags, cuMemHostGetFlags, cuMemHostGetFlags)                 \
  X(PointerGetAttribute, cuPointerGetAttribute, cuPointerGetAttribute)

#define LAZYPIN_DRIVER_CALL(accessor, symbol, like)                              \
  inline real::Lazy<decltype(&::like)> accessor##Slot;                            \
  inline decltype(&::like) accessor() { return accessor##Slot.Get(&real::Driver, #symbol); }
LAZYPIN_DRIVER_CALLS(LAZYPIN_DRIVER_CALL)
#undef LAZYPIN_DRIVER_CALL
#undef LAZYPIN_DRIVER_CALLS

}  // namespace driver
}  // namespace lazypin
