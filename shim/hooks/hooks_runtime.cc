// hooks_runtime: cudaHostRegister and cudaHostUnregister, and the pinned host
// allocations cudaHostAlloc, cudaMallocHost and cudaFreeHost, exported
// (dynamic cudart, PyTorch) and handed out by our dlsym (ctypes), one copy
// per door. Each takes its caller (dispatch.h's Caller, for the call-site
// cache) and is one call into Dispatch::Runtime (HostRuntime), which
// takes pool hits and deferrals itself and otherwise calls cudart, whose
// driver calls reach hooks_driver beneath.
#include <string.h>

#include "cuda_runtime_api.h"
#include "dispatch.h"
#include "hooks.h"
#include "real.h"
#include "export.h"
#include "state.h"
#include "thread_state.h"

namespace lazypin {
namespace {

using RegisterFn = cudaError_t (*)(void*, size_t, unsigned int);
using UnregisterFn = cudaError_t (*)(void*);

using HostAllocFn = cudaError_t (*)(void**, size_t, unsigned int);
using MallocHostFn = cudaError_t (*)(void**, size_t);
using FreeHostFn = cudaError_t (*)(void*);

real::Lazy<RegisterFn> g_register[kViaCount];
real::Lazy<UnregisterFn> g_unregister[kViaCount];
real::Lazy<HostAllocFn> g_host_alloc[kViaCount];
real::Lazy<MallocHostFn> g_malloc_host[kViaCount];
real::Lazy<FreeHostFn> g_free_host[kViaCount];

Dispatch* ActiveDispatch() { return t_state.inside ? nullptr : ActiveState()->dispatch; }

template <Via V>
cudaError_t CallRegister(Caller caller, void* ptr, size_t bytes, unsigned int flags) {
  RegisterFn real = g_register[static_cast<int>(V)].Get(&real::Runtime, "cudaHostRegister");
  if (real == nullptr) return cudaErrorUnknown;
  Dispatch* dispatch = ActiveDispatch();
  if (dispatch == nullptr) return real(ptr, bytes, flags);
  return static_cast<cudaError_t>(dispatch->Runtime(
      {Api::kCudaHostRegister, V, ptr, bytes, flags, caller}, [&] { return static_cast<int>(real(ptr, bytes, flags)); }));
}

template <Via V>
cudaError_t CallUnregister(Caller caller, void* ptr) {
  UnregisterFn real = g_unregister[static_cast<int>(V)].Get(&real::Runtime, "cudaHostUnregister");
  if (real == nullptr) return cudaErrorUnknown;
  Dispatch* dispatch = ActiveDispatch();
  if (dispatch == nullptr) return real(ptr);
  return static_cast<cudaError_t>(dispatch->Runtime({Api::kCudaHostUnregister, V, ptr, 0, 0, caller},
                                                    [&] { return static_cast<int>(real(ptr)); }));
}

template <Via V>
cudaError_t CallHostAlloc(Caller caller, void** p, size_t bytes, unsigned int flags) {
  HostAllocFn real = g_host_alloc[static_cast<int>(V)].Get(&real::Runtime, "cudaHostAlloc");
  if (real == nullptr) return cudaErrorUnknown;
  Dispatch* dispatch = ActiveDispatch();
  if (dispatch == nullptr) return real(p, bytes, flags);
  return static_cast<cudaError_t>(dispatch->HostRuntime(
      {Api::kCudaHostAlloc, V, nullptr, bytes, flags, caller}, p,
      [&] { return static_cast<int>(real(p, bytes, flags)); }));
}

template <Via V>
cudaError_t CallMallocHost(Caller caller, void** p, size_t bytes) {
  MallocHostFn real = g_malloc_host[static_cast<int>(V)].Get(&real::Runtime, "cudaMallocHost");
  if (real == nullptr) return cudaErrorUnknown;
  Dispatch* dispatch = ActiveDispatch();
  if (dispatch == nullptr) return real(p, bytes);
  return static_cast<cudaError_t>(dispatch->HostRuntime(
      {Api::kCudaMallocHost, V, nullptr, bytes, 0, caller}, p, [&] { return static_cast<int>(real(p, bytes)); }));
}

template <Via V>
cudaError_t CallFreeHost(Caller caller, void* ptr) {
  FreeHostFn real = g_free_host[static_cast<int>(V)].Get(&real::Runtime, "cudaFreeHost");
  if (real == nullptr) return cudaErrorUnknown;
  Dispatch* dispatch = ActiveDispatch();
  if (dispatch == nullptr) return real(ptr);
  return static_cast<cudaError_t>(dispatch->HostRuntime(
      {Api::kCudaFreeHost, V, ptr, 0, 0, caller}, nullptr, [&] { return static_cast<int>(real(ptr)); }));
}

// The per-door copies RuntimeHookOf hands out: each takes its caller here, in
// the function the program called, and passes it down (as the exported
// functions at the end of this file do).
template <Via V>
cudaError_t HookRegister(void* ptr, size_t bytes, unsigned int flags) {
  return CallRegister<V>(LAZYPIN_CALLER(), ptr, bytes, flags);
}

template <Via V>
cudaError_t HookUnregister(void* ptr) {
  return CallUnregister<V>(LAZYPIN_CALLER(), ptr);
}

template <Via V>
cudaError_t HookHostAlloc(void** p, size_t bytes, unsigned int flags) {
  return CallHostAlloc<V>(LAZYPIN_CALLER(), p, bytes, flags);
}

template <Via V>
cudaError_t HookMallocHost(void** p, size_t bytes) {
  return CallMallocHost<V>(LAZYPIN_CALLER(), p, bytes);
}

template <Via V>
cudaError_t HookFreeHost(void* ptr) {
  return CallFreeHost<V>(LAZYPIN_CALLER(), ptr);
}

// The runtime entry points, by name: each door's hook and real-function slots.
enum class Entry { kRegister, kUnregister, kHostAlloc, kMallocHost, kFreeHost, kUnknown };

Entry EntryOf(const char* name) {
  static constexpr const char* kNames[] = {"cudaHostRegister", "cudaHostUnregister",
                                           "cudaHostAlloc", "cudaMallocHost", "cudaFreeHost"};
  for (int i = 0; i < 5; ++i) {
    if (strcmp(name, kNames[i]) == 0) return static_cast<Entry>(i);
  }
  return Entry::kUnknown;
}

template <Via V>
void* HookFor(Entry entry) {
  switch (entry) {
    case Entry::kRegister: return reinterpret_cast<void*>(&HookRegister<V>);
    case Entry::kUnregister: return reinterpret_cast<void*>(&HookUnregister<V>);
    case Entry::kHostAlloc: return reinterpret_cast<void*>(&HookHostAlloc<V>);
    case Entry::kMallocHost: return reinterpret_cast<void*>(&HookMallocHost<V>);
    case Entry::kFreeHost: return reinterpret_cast<void*>(&HookFreeHost<V>);
    case Entry::kUnknown: break;
  }
  return nullptr;
}

}  // namespace

void* RuntimeHookOf(const char* name, Via via) {
  const Entry entry = EntryOf(name);
  switch (via) {
    case Via::kSymbol: return HookFor<Via::kSymbol>(entry);
    case Via::kDlsym: return HookFor<Via::kDlsym>(entry);
    case Via::kGetProc: return HookFor<Via::kGetProc>(entry);
  }
  return nullptr;
}

bool OfferRuntimeReal(const char* name, Via via, void* fn) {
  if (via != Via::kDlsym) return false;
  const int door = static_cast<int>(via);
  switch (EntryOf(name)) {
    case Entry::kRegister: return g_register[door].Offer(fn);
    case Entry::kUnregister: return g_unregister[door].Offer(fn);
    case Entry::kHostAlloc: return g_host_alloc[door].Offer(fn);
    case Entry::kMallocHost: return g_malloc_host[door].Offer(fn);
    case Entry::kFreeHost: return g_free_host[door].Offer(fn);
    case Entry::kUnknown: break;
  }
  return false;
}

}  // namespace lazypin

LAZYPIN_EXPORT cudaError_t cudaHostRegister(void* ptr, size_t bytes, unsigned int flags) {
  return lazypin::CallRegister<lazypin::Via::kSymbol>(LAZYPIN_CALLER(), ptr, bytes, flags);
}

LAZYPIN_EXPORT cudaError_t cudaHostUnregister(void* ptr) {
  return lazypin::CallUnregister<lazypin::Via::kSymbol>(LAZYPIN_CALLER(), ptr);
}

LAZYPIN_EXPORT cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int flags) {
  return lazypin::CallHostAlloc<lazypin::Via::kSymbol>(LAZYPIN_CALLER(), p, bytes, flags);
}

LAZYPIN_EXPORT cudaError_t cudaMallocHost(void** p, size_t bytes) {
  return lazypin::CallMallocHost<lazypin::Via::kSymbol>(LAZYPIN_CALLER(), p, bytes);
}

LAZYPIN_EXPORT cudaError_t cudaFreeHost(void* ptr) {
  return lazypin::CallFreeHost<lazypin::Via::kSymbol>(LAZYPIN_CALLER(), ptr);
}
