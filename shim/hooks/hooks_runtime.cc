// hooks_runtime: cudaHostRegister and cudaHostUnregister, and the pinned host
// allocations cudaHostAlloc, cudaMallocHost and cudaFreeHost, exported
// (dynamic cudart, PyTorch) and handed out by our dlsym (ctypes), one copy
// per door (driver_hook.h's HOOK_WITH). Each takes its caller (dispatch.h's
// Caller, for the call-site cache) and is one call into Dispatch::Runtime
// (HostRuntime), which takes pool hits and deferrals itself and otherwise
// calls cudart, whose driver calls reach hooks_driver beneath.
#include "driver_hook.h"  // first: cuda.h's names as the driver exports them

#include "cuda_runtime_api.h"

using namespace lazypin;  // NOLINT: the hooks below are C symbols

#define RUNTIME_HOOK(...) HOOK_WITH(LAZYPIN_CALLER(), cudaErrorUnknown, __VA_ARGS__)

RUNTIME_HOOK(cudaHostRegister, cudaError_t, real::Runtime, (void*, ptr), (size_t, bytes),
             (unsigned int, flags)) {
  Dispatch* dispatch = ActiveDispatch();
  if (dispatch == nullptr) return real(ptr, bytes, flags);
  return static_cast<cudaError_t>(dispatch->Runtime({Api::kCudaHostRegister, V, ptr, bytes, flags, caller},
                                                    [&] { return static_cast<int>(real(ptr, bytes, flags)); }));
}

RUNTIME_HOOK(cudaHostUnregister, cudaError_t, real::Runtime, (void*, ptr)) {
  Dispatch* dispatch = ActiveDispatch();
  if (dispatch == nullptr) return real(ptr);
  return static_cast<cudaError_t>(dispatch->Runtime({Api::kCudaHostUnregister, V, ptr, 0, 0, caller},
                                                    [&] { return static_cast<int>(real(ptr)); }));
}

RUNTIME_HOOK(cudaHostAlloc, cudaError_t, real::Runtime, (void**, p), (size_t, bytes), (unsigned int, flags)) {
  Dispatch* dispatch = ActiveDispatch();
  if (dispatch == nullptr) return real(p, bytes, flags);
  return static_cast<cudaError_t>(dispatch->HostRuntime({Api::kCudaHostAlloc, V, nullptr, bytes, flags, caller}, p,
                                                        [&] { return static_cast<int>(real(p, bytes, flags)); }));
}

RUNTIME_HOOK(cudaMallocHost, cudaError_t, real::Runtime, (void**, p), (size_t, bytes)) {
  Dispatch* dispatch = ActiveDispatch();
  if (dispatch == nullptr) return real(p, bytes);
  return static_cast<cudaError_t>(dispatch->HostRuntime({Api::kCudaMallocHost, V, nullptr, bytes, 0, caller}, p,
                                                        [&] { return static_cast<int>(real(p, bytes)); }));
}

RUNTIME_HOOK(cudaFreeHost, cudaError_t, real::Runtime, (void*, ptr)) {
  Dispatch* dispatch = ActiveDispatch();
  if (dispatch == nullptr) return real(ptr);
  return static_cast<cudaError_t>(dispatch->HostRuntime({Api::kCudaFreeHost, V, ptr, 0, 0, caller}, nullptr,
                                                        [&] { return static_cast<int>(real(ptr)); }));
}

HOOK_TABLE(RuntimeHooks,
    RUNTIME_ENTRY(cudaHostRegister), RUNTIME_ENTRY(cudaHostUnregister), RUNTIME_ENTRY(cudaHostAlloc),
    RUNTIME_ENTRY(cudaMallocHost),   RUNTIME_ENTRY(cudaFreeHost))
