// hooks_runtime: cudaHostRegister and cudaHostUnregister, exported (dynamic
// cudart, PyTorch) and handed out by our dlsym (ctypes), one copy per door.
// Each is one call into Dispatch::Runtime, which takes pool hits and
// deferrals itself and otherwise calls cudart, whose driver calls reach
// hooks_driver beneath.
#include <string.h>

#include "cuda_runtime_api.h"
#include "dispatch.h"
#include "hooks.h"
#include "real.h"
#include "shim.h"
#include "state.h"
#include "thread_state.h"

namespace lazypin {
namespace {

using RegisterFn = cudaError_t (*)(void*, size_t, unsigned int);
using UnregisterFn = cudaError_t (*)(void*);

real::Lazy<RegisterFn> g_register[kViaCount];
real::Lazy<UnregisterFn> g_unregister[kViaCount];

Dispatch* ActiveDispatch() { return t_state.inside ? nullptr : ActiveState()->dispatch; }

template <Via V>
cudaError_t HookRegister(void* ptr, size_t bytes, unsigned int flags) {
  RegisterFn real = g_register[static_cast<int>(V)].Get(&real::Runtime, "cudaHostRegister");
  if (real == nullptr) return cudaErrorUnknown;
  Dispatch* dispatch = ActiveDispatch();
  if (dispatch == nullptr) return real(ptr, bytes, flags);
  return static_cast<cudaError_t>(dispatch->Runtime(
      {Api::kCudaHostRegister, V, ptr, bytes, flags}, [&] { return static_cast<int>(real(ptr, bytes, flags)); }));
}

template <Via V>
cudaError_t HookUnregister(void* ptr) {
  UnregisterFn real = g_unregister[static_cast<int>(V)].Get(&real::Runtime, "cudaHostUnregister");
  if (real == nullptr) return cudaErrorUnknown;
  Dispatch* dispatch = ActiveDispatch();
  if (dispatch == nullptr) return real(ptr);
  return static_cast<cudaError_t>(dispatch->Runtime({Api::kCudaHostUnregister, V, ptr, 0, 0},
                                                    [&] { return static_cast<int>(real(ptr)); }));
}

template <Via V>
void* HookFor(bool reg) {
  return reg ? reinterpret_cast<void*>(&HookRegister<V>) : reinterpret_cast<void*>(&HookUnregister<V>);
}

}  // namespace

void* RuntimeHookOf(const char* name, Via via) {
  const bool reg = strcmp(name, "cudaHostRegister") == 0;
  switch (via) {
    case Via::kSymbol: return HookFor<Via::kSymbol>(reg);
    case Via::kDlsym: return HookFor<Via::kDlsym>(reg);
    case Via::kGetProc: return HookFor<Via::kGetProc>(reg);
  }
  return nullptr;
}

bool OfferRuntimeReal(const char* name, Via via, void* fn) {
  if (via != Via::kDlsym) return false;
  const int door = static_cast<int>(via);
  if (strcmp(name, "cudaHostRegister") == 0) return g_register[door].Offer(fn);
  return g_unregister[door].Offer(fn);
}

}  // namespace lazypin

LAZYPIN_EXPORT cudaError_t cudaHostRegister(void* ptr, size_t bytes, unsigned int flags) {
  return lazypin::HookRegister<lazypin::Via::kSymbol>(ptr, bytes, flags);
}

LAZYPIN_EXPORT cudaError_t cudaHostUnregister(void* ptr) {
  return lazypin::HookUnregister<lazypin::Via::kSymbol>(ptr);
}
