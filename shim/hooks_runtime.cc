// hooks_runtime: cudaHostRegister and cudaHostUnregister, exported (dynamic
// cudart, PyTorch) and handed out by our dlsym (ctypes). They time and record
// the program's call; the pool acts in the driver hook that cudart reaches
// through cuGetProcAddress beneath them, where the current context is known.
#include <string.h>

#include "cuda_runtime_api.h"
#include "real.h"
#include "shim.h"

namespace lazypin {
namespace {

using RegisterFn = cudaError_t (*)(void*, size_t, unsigned int);
using UnregisterFn = cudaError_t (*)(void*);

template <Via V>
real::Lazy<RegisterFn>& RegisterSlot() {
  static real::Lazy<RegisterFn> slot;
  return slot;
}
template <Via V>
real::Lazy<UnregisterFn>& UnregisterSlot() {
  static real::Lazy<UnregisterFn> slot;
  return slot;
}

template <Via V>
cudaError_t HookRegister(void* ptr, size_t bytes, unsigned int flags) {
  RegisterFn real = RegisterSlot<V>().Get(&real::Runtime, "cudaHostRegister");
  if (real == nullptr) return cudaErrorUnknown;
  Shim* shim = t_state.inside ? nullptr : Shim::Active();
  if (shim == nullptr) return real(ptr, bytes, flags);
  return static_cast<cudaError_t>(
      shim->RuntimeCall(Api::kCudaHostRegister, V, ptr, bytes, flags,
                        [&] { return static_cast<int>(real(ptr, bytes, flags)); }));
}

template <Via V>
cudaError_t HookUnregister(void* ptr) {
  UnregisterFn real = UnregisterSlot<V>().Get(&real::Runtime, "cudaHostUnregister");
  if (real == nullptr) return cudaErrorUnknown;
  Shim* shim = t_state.inside ? nullptr : Shim::Active();
  if (shim == nullptr) return real(ptr);
  return static_cast<cudaError_t>(shim->RuntimeCall(
      Api::kCudaHostUnregister, V, ptr, 0, 0, [&] { return static_cast<int>(real(ptr)); }));
}

}  // namespace

// For our dlsym (hooks_driver.cc): the copy of a runtime hook for a door.
void* RuntimeHookOf(const char* name, Via via) {
  const bool reg = strcmp(name, "cudaHostRegister") == 0;
  switch (via) {
    case Via::kSymbol:
      return reg ? reinterpret_cast<void*>(&HookRegister<Via::kSymbol>)
                 : reinterpret_cast<void*>(&HookUnregister<Via::kSymbol>);
    case Via::kDlsym:
      return reg ? reinterpret_cast<void*>(&HookRegister<Via::kDlsym>)
                 : reinterpret_cast<void*>(&HookUnregister<Via::kDlsym>);
    case Via::kGetProc:
      return reg ? reinterpret_cast<void*>(&HookRegister<Via::kGetProc>)
                 : reinterpret_cast<void*>(&HookUnregister<Via::kGetProc>);
  }
  return nullptr;
}

bool OfferRuntimeReal(const char* name, Via via, void* fn) {
  if (via != Via::kDlsym) return false;
  if (strcmp(name, "cudaHostRegister") == 0) return RegisterSlot<Via::kDlsym>().Offer(fn);
  return UnregisterSlot<Via::kDlsym>().Offer(fn);
}

}  // namespace lazypin

LAZYPIN_EXPORT cudaError_t cudaHostRegister(void* ptr, size_t bytes, unsigned int flags) {
  return lazypin::HookRegister<lazypin::Via::kSymbol>(ptr, bytes, flags);
}

LAZYPIN_EXPORT cudaError_t cudaHostUnregister(void* ptr) {
  return lazypin::HookUnregister<lazypin::Via::kSymbol>(ptr);
}
