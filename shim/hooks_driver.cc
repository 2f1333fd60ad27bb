// hooks_driver: the driver API hooks, and the two doors into them that do not
// go through symbol interposition: our `dlsym` (a program, ctypes or cudart
// asking a library handle for a function) and our wrappers of
// `cuGetProcAddress(_v2)` (static cudart, CuPy, cuda-python: every driver
// entry point comes from the getter). Each hook exists in three copies, one
// per door (Via), each with its own real function, so the log says how the
// program reached it and no door's real function is mistaken for another's.
#include <dlfcn.h>
#include <string.h>

#include <climits>

// Every versioned name (cuMemHostRegister and cuMemHostRegister_v2 alike)
// must stay itself here, not be renamed by cuda.h's #defines.
#define __CUDA_API_VERSION_INTERNAL 1
#include "cuda.h"
#include "real.h"
#include "shim.h"

namespace lazypin {
namespace {

// A hooked entry point: how it is named to dlsym and to the getter, and its
// three hook copies with a way to hand each its real function.
struct HookEntry {
  const char* name;       // exported symbol and dlsym name, e.g. "cuMemHostRegister_v2"
  const char* proc_name;  // name the getter is asked, e.g. "cuMemHostRegister"
  int min_version, max_version;  // getter cudaVersion range this entry serves
  void* (*hook)(Via via);
  bool (*offer)(Via via, void* real);  // false: keep the real function, no hook
};

void* DriverSymbol(const char* name) {
  if (void* fn = real::Next(name)) return fn;
  return real::Driver(name);
}

bool IsOurs(void* fn) {
  static void* const self_base = [] {
    Dl_info info;
    return dladdr(reinterpret_cast<void*>(&DriverSymbol), &info) ? info.dli_fbase : nullptr;
  }();
  Dl_info info;
  return fn != nullptr && dladdr(fn, &info) != 0 && info.dli_fbase == self_base;
}

}  // namespace
}  // namespace lazypin

using namespace lazypin;  // NOLINT: the hooks below are C symbols

// HOOK(NAME, RET, PARAMS, ARGS, RESOLVE) { body using `real` and `V` }
// defines the three copies Hook_NAME<Via>, each with its own real-function slot
// (resolved by name for the symbol door, offered by dlsym or the getter for
// the others), and exports NAME itself.
#define HOOK(NAME, RET, PARAMS, ARGS, RESOLVE)                                     \
  using Fn_##NAME = RET(*) PARAMS;                                                  \
  template <Via V>                                                                  \
  real::Lazy<Fn_##NAME>& Slot_##NAME() {                                            \
    static real::Lazy<Fn_##NAME> slot;                                              \
    return slot;                                                                    \
  }                                                                                 \
  template <Via V>                                                                  \
  RET Body_##NAME(Fn_##NAME real, PARAMS_##NAME);                                   \
  template <Via V>                                                                  \
  RET Hook_##NAME PARAMS {                                                          \
    Fn_##NAME real = Slot_##NAME<V>().Get(&RESOLVE, #NAME);                         \
    if (real == nullptr) return static_cast<RET>(CUDA_ERROR_NOT_INITIALIZED);       \
    return Body_##NAME<V>(real, ARGS_##NAME);                                       \
  }                                                                                 \
  LAZYPIN_EXPORT RET NAME PARAMS { return Hook_##NAME<Via::kSymbol> ARGS; }         \
  static void* HookOf_##NAME(Via via) {                                             \
    switch (via) {                                                                  \
      case Via::kSymbol: return reinterpret_cast<void*>(&Hook_##NAME<Via::kSymbol>);   \
      case Via::kDlsym: return reinterpret_cast<void*>(&Hook_##NAME<Via::kDlsym>);     \
      case Via::kGetProc: return reinterpret_cast<void*>(&Hook_##NAME<Via::kGetProc>); \
    }                                                                               \
    return nullptr;                                                                 \
  }                                                                                 \
  static bool OfferReal_##NAME(Via via, void* fn) {                                 \
    if (via == Via::kDlsym) return Slot_##NAME<Via::kDlsym>().Offer(fn);            \
    if (via == Via::kGetProc) return Slot_##NAME<Via::kGetProc>().Offer(fn);        \
    return false;                                                                   \
  }                                                                                 \
  template <Via V>                                                                  \
  RET Body_##NAME(Fn_##NAME real, PARAMS_##NAME)

// ---- registration ----------------------------------------------------------
#define PARAMS_cuMemHostRegister void* p, size_t bytes, unsigned int flags
#define ARGS_cuMemHostRegister p, bytes, flags
HOOK(cuMemHostRegister, CUresult, (void* p, size_t bytes, unsigned int flags), (p, bytes, flags),
     DriverSymbol) {
  Shim* shim = t_state.inside ? nullptr : Shim::Active();
  if (shim == nullptr) return real(p, bytes, flags);
  return static_cast<CUresult>(shim->DriverRegister(
      Api::kCuMemHostRegister, V, p, bytes, flags, [&] { return int{real(p, bytes, flags)}; }));
}

#define PARAMS_cuMemHostRegister_v2 void* p, size_t bytes, unsigned int flags
#define ARGS_cuMemHostRegister_v2 p, bytes, flags
HOOK(cuMemHostRegister_v2, CUresult, (void* p, size_t bytes, unsigned int flags),
     (p, bytes, flags), DriverSymbol) {
  Shim* shim = t_state.inside ? nullptr : Shim::Active();
  if (shim == nullptr) return real(p, bytes, flags);
  return static_cast<CUresult>(shim->DriverRegister(
      Api::kCuMemHostRegisterV2, V, p, bytes, flags, [&] { return int{real(p, bytes, flags)}; }));
}

#define PARAMS_cuMemHostUnregister void* p
#define ARGS_cuMemHostUnregister p
HOOK(cuMemHostUnregister, CUresult, (void* p), (p), DriverSymbol) {
  Shim* shim = t_state.inside ? nullptr : Shim::Active();
  if (shim == nullptr) return real(p);
  return static_cast<CUresult>(
      shim->DriverUnregister(Api::kCuMemHostUnregister, V, p, [&] { return int{real(p)}; }));
}

// ---- context teardown: the driver drops that context's registrations --------
#define CONTEXT_HOOK(NAME, PARAM_TYPE, ACTION)                                       \
  HOOK(NAME, CUresult, (PARAM_TYPE arg), (arg), DriverSymbol) {                      \
    Shim* shim = t_state.inside ? nullptr : Shim::IfActive();                        \
    if (shim != nullptr) ACTION;                                                     \
    return real(arg);                                                                \
  }
#define PARAMS_cuCtxDestroy CUcontext arg
#define ARGS_cuCtxDestroy arg
CONTEXT_HOOK(cuCtxDestroy, CUcontext, shim->BeforeContextDestroy(arg))
#define PARAMS_cuCtxDestroy_v2 CUcontext arg
#define ARGS_cuCtxDestroy_v2 arg
CONTEXT_HOOK(cuCtxDestroy_v2, CUcontext, shim->BeforeContextDestroy(arg))
#define PARAMS_cuDevicePrimaryCtxReset CUdevice arg
#define ARGS_cuDevicePrimaryCtxReset arg
CONTEXT_HOOK(cuDevicePrimaryCtxReset, CUdevice, shim->BeforePrimaryContextReset(arg, true))
#define PARAMS_cuDevicePrimaryCtxReset_v2 CUdevice arg
#define ARGS_cuDevicePrimaryCtxReset_v2 arg
CONTEXT_HOOK(cuDevicePrimaryCtxReset_v2, CUdevice, shim->BeforePrimaryContextReset(arg, true))
#define PARAMS_cuDevicePrimaryCtxRelease CUdevice arg
#define ARGS_cuDevicePrimaryCtxRelease arg
CONTEXT_HOOK(cuDevicePrimaryCtxRelease, CUdevice, shim->BeforePrimaryContextReset(arg, false))
#define PARAMS_cuDevicePrimaryCtxRelease_v2 CUdevice arg
#define ARGS_cuDevicePrimaryCtxRelease_v2 arg
CONTEXT_HOOK(cuDevicePrimaryCtxRelease_v2, CUdevice, shim->BeforePrimaryContextReset(arg, false))

// ---- pointer queries: memory the program unregistered must look unregistered
#define PARAMS_cuPointerGetAttribute void* data, CUpointer_attribute attribute, CUdeviceptr ptr
#define ARGS_cuPointerGetAttribute data, attribute, ptr
HOOK(cuPointerGetAttribute, CUresult, (void* data, CUpointer_attribute attribute, CUdeviceptr ptr),
     (data, attribute, ptr), DriverSymbol) {
  if (Shim* shim = t_state.inside ? nullptr : Shim::IfActive()) shim->BeforeQuery(ptr);
  return real(data, attribute, ptr);
}

#define PARAMS_cuPointerGetAttributes \
  unsigned int count, CUpointer_attribute* attributes, void** data, CUdeviceptr ptr
#define ARGS_cuPointerGetAttributes count, attributes, data, ptr
HOOK(cuPointerGetAttributes, CUresult,
     (unsigned int count, CUpointer_attribute* attributes, void** data, CUdeviceptr ptr),
     (count, attributes, data, ptr), DriverSymbol) {
  if (Shim* shim = t_state.inside ? nullptr : Shim::IfActive()) shim->BeforeQuery(ptr);
  return real(count, attributes, data, ptr);
}

#define PARAMS_cuMemHostGetFlags unsigned int* flags, void* p
#define ARGS_cuMemHostGetFlags flags, p
HOOK(cuMemHostGetFlags, CUresult, (unsigned int* flags, void* p), (flags, p), DriverSymbol) {
  if (Shim* shim = t_state.inside ? nullptr : Shim::IfActive()) {
    shim->BeforeQuery(reinterpret_cast<uintptr_t>(p));
  }
  return real(flags, p);
}

#define PARAMS_cuMemHostGetDevicePointer_v2 CUdeviceptr* dptr, void* p, unsigned int flags
#define ARGS_cuMemHostGetDevicePointer_v2 dptr, p, flags
HOOK(cuMemHostGetDevicePointer_v2, CUresult, (CUdeviceptr* dptr, void* p, unsigned int flags),
     (dptr, p, flags), DriverSymbol) {
  if (Shim* shim = t_state.inside ? nullptr : Shim::IfActive()) {
    shim->BeforeQuery(reinterpret_cast<uintptr_t>(p));
  }
  return real(dptr, p, flags);
}

// ---- the getter: hand back our hooks for the entry points we own -----------
namespace lazypin {
void SwapForHook(const char* symbol, int version, void** pfn);
}

#define PARAMS_cuGetProcAddress \
  const char* symbol, void** pfn, int version, cuuint64_t flags
#define ARGS_cuGetProcAddress symbol, pfn, version, flags
HOOK(cuGetProcAddress, CUresult,
     (const char* symbol, void** pfn, int version, cuuint64_t flags), (symbol, pfn, version, flags),
     DriverSymbol) {
  const CUresult result = real(symbol, pfn, version, flags);
  if (result == CUDA_SUCCESS) SwapForHook(symbol, version, pfn);
  return result;
}

#define PARAMS_cuGetProcAddress_v2                                           \
  const char* symbol, void** pfn, int version, cuuint64_t flags,             \
      CUdriverProcAddressQueryResult* status
#define ARGS_cuGetProcAddress_v2 symbol, pfn, version, flags, status
HOOK(cuGetProcAddress_v2, CUresult,
     (const char* symbol, void** pfn, int version, cuuint64_t flags,
      CUdriverProcAddressQueryResult* status),
     (symbol, pfn, version, flags, status), DriverSymbol) {
  const CUresult result = real(symbol, pfn, version, flags, status);
  if (result == CUDA_SUCCESS) SwapForHook(symbol, version, pfn);
  return result;
}

// ---- runtime hooks (hooks_runtime.cc) join the same table ------------------
namespace lazypin {
void* RuntimeHookOf(const char* name, Via via);
bool OfferRuntimeReal(const char* name, Via via, void* fn);
}  // namespace lazypin

namespace lazypin {
namespace {

#define ENTRY(NAME, PROC, MIN, MAX) {#NAME, PROC, MIN, MAX, &HookOf_##NAME, &OfferReal_##NAME}
#define RUNTIME_ENTRY(NAME)                                                             \
  {#NAME, nullptr, 0, -1, [](Via via) { return RuntimeHookOf(#NAME, via); },          \
   [](Via via, void* fn) { return OfferRuntimeReal(#NAME, via, fn); }}
const HookEntry kHooks[] = {
    ENTRY(cuMemHostRegister, "cuMemHostRegister", 0, 6049),
    ENTRY(cuMemHostRegister_v2, "cuMemHostRegister", 6050, INT_MAX),
    ENTRY(cuMemHostUnregister, "cuMemHostUnregister", 0, INT_MAX),
    ENTRY(cuCtxDestroy, "cuCtxDestroy", 0, 3999),
    ENTRY(cuCtxDestroy_v2, "cuCtxDestroy", 4000, INT_MAX),
    ENTRY(cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset", 0, 10999),
    ENTRY(cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset", 11000, INT_MAX),
    ENTRY(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", 0, 10999),
    ENTRY(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 11000, INT_MAX),
    ENTRY(cuPointerGetAttribute, "cuPointerGetAttribute", 0, INT_MAX),
    ENTRY(cuPointerGetAttributes, "cuPointerGetAttributes", 0, INT_MAX),
    ENTRY(cuMemHostGetFlags, "cuMemHostGetFlags", 0, INT_MAX),
    ENTRY(cuMemHostGetDevicePointer_v2, "cuMemHostGetDevicePointer", 3020, INT_MAX),
    ENTRY(cuGetProcAddress, "cuGetProcAddress", 0, 11999),
    ENTRY(cuGetProcAddress_v2, "cuGetProcAddress", 12000, INT_MAX),
    RUNTIME_ENTRY(cudaHostRegister),
    RUNTIME_ENTRY(cudaHostUnregister),
};

const HookEntry* FindByName(const char* name) {
  for (const HookEntry& e : kHooks) {
    if (strcmp(e.name, name) == 0) return &e;
  }
  return nullptr;
}

void* DlsymHooked(void* handle, const char* symbol, const HookEntry& entry) {
  void* fn = real::Dlsym()(handle, symbol);
  if (fn == nullptr && handle == RTLD_DEFAULT) {
    // A caller loaded RTLD_LOCAL may see libcuda/libcudart where we cannot.
    fn = entry.proc_name != nullptr ? real::Driver(symbol) : real::Runtime(symbol);
  }
  if (fn == nullptr || IsOurs(fn) || !entry.offer(Via::kDlsym, fn)) return fn;
  return entry.hook(Via::kDlsym);
}

}  // namespace

void SwapForHook(const char* symbol, int version, void** pfn) {
  if (symbol == nullptr || pfn == nullptr || *pfn == nullptr || IsOurs(*pfn)) return;
  for (const HookEntry& e : kHooks) {
    if (e.proc_name != nullptr && strcmp(e.proc_name, symbol) == 0 && version >= e.min_version &&
        version <= e.max_version) {
      if (e.offer(Via::kGetProc, *pfn)) *pfn = e.hook(Via::kGetProc);
      return;
    }
  }
}

}  // namespace lazypin

// glibc's dlsym looks in the caller's scope (RTLD_NEXT, RTLD_DEFAULT): every
// lookup of a name we do not hook leaves here as a tail call, so that glibc
// still sees the program's return address. RTLD_NEXT lookups of hooked names
// are the program's own interposition and pass through untouched.
#pragma GCC diagnostic ignored "-Wnonnull-compare"  // glibc says nonnull; programs pass null
LAZYPIN_EXPORT void* dlsym(void* __restrict handle, const char* __restrict symbol) {
  if (symbol != nullptr && symbol[0] == 'c' && symbol[1] == 'u' && handle != RTLD_NEXT) {
    if (const HookEntry* entry = FindByName(symbol)) return DlsymHooked(handle, symbol, *entry);
  }
  return real::Dlsym()(handle, symbol);
}
