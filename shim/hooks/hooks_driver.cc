// hooks_driver: the driver's registration, host-allocation, context
// teardown and pointer-query hooks, and the two doors into every driver hook
// that do not go through symbol interposition: our `dlsym` (a program, ctypes
// or cudart asking a library handle for a function) and our wrappers of
// `cuGetProcAddress(_v2)` (static cudart, CuPy, cuda-python: every driver
// entry point comes from the getter). Each hook exists in three copies, one
// per door (Via), each with its own real function, so the log says how the
// program reached it and no door's real function is mistaken for another's
// (driver_hook.h). The copy, capture and graph hooks are in files of their
// own, each with its table; the doors read them all.
#include "driver_hook.h"  // first: cuda.h's names as the driver exports them

#include <dlfcn.h>
#include <string.h>

#include "driver_calls.h"
#include "pages.h"

namespace lazypin {

void* DriverSymbol(const char* name) {
  if (void* fn = real::Next(name)) return fn;
  return real::Driver(name);
}

namespace {

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

// ---- registration ----------------------------------------------------------
RECORDED_HOOK(cuMemHostRegister, CUresult, DriverSymbol, (void*, p), (size_t, bytes), (unsigned int, flags)) {
  Dispatch* dispatch = ActiveDispatch();
  if (dispatch == nullptr) return real(p, bytes, flags);
  return static_cast<CUresult>(dispatch->Driver({Api::kCuMemHostRegister, V, p, bytes, flags, caller},
                                                [&] { return int{real(p, bytes, flags)}; }));
}

RECORDED_HOOK(cuMemHostRegister_v2, CUresult, DriverSymbol, (void*, p), (size_t, bytes),
     (unsigned int, flags)) {
  Dispatch* dispatch = ActiveDispatch();
  if (dispatch == nullptr) return real(p, bytes, flags);
  return static_cast<CUresult>(dispatch->Driver({Api::kCuMemHostRegisterV2, V, p, bytes, flags, caller},
                                                [&] { return int{real(p, bytes, flags)}; }));
}

RECORDED_HOOK(cuMemHostUnregister, CUresult, DriverSymbol, (void*, p)) {
  Dispatch* dispatch = ActiveDispatch();
  if (dispatch == nullptr) return real(p);
  return static_cast<CUresult>(
      dispatch->Driver({Api::kCuMemHostUnregister, V, p, 0, 0, caller}, [&] { return int{real(p)}; }));
}

// ---- pinned host allocations: the host-allocation cache (host_alloc_cache.h)
#define HOST_ALLOC_HOOK(NAME, API, SIZE_TYPE)                                               \
  RECORDED_HOOK(NAME, CUresult, DriverSymbol, (void**, pp), (SIZE_TYPE, bytes)) {           \
    Dispatch* dispatch = ActiveDispatch();                                                  \
    if (dispatch == nullptr) return real(pp, bytes);                                        \
    return static_cast<CUresult>(dispatch->HostDriver({API, V, nullptr, bytes, 0, caller}, pp, \
                                                      [&] { return int{real(pp, bytes)}; })); \
  }
HOST_ALLOC_HOOK(cuMemAllocHost, Api::kCuMemAllocHost, unsigned int)
HOST_ALLOC_HOOK(cuMemAllocHost_v2, Api::kCuMemAllocHostV2, size_t)

RECORDED_HOOK(cuMemHostAlloc, CUresult, DriverSymbol, (void**, pp), (size_t, bytes), (unsigned int, flags)) {
  Dispatch* dispatch = ActiveDispatch();
  if (dispatch == nullptr) return real(pp, bytes, flags);
  return static_cast<CUresult>(dispatch->HostDriver({Api::kCuMemHostAlloc, V, nullptr, bytes, flags, caller},
                                                    pp, [&] { return int{real(pp, bytes, flags)}; }));
}

RECORDED_HOOK(cuMemFreeHost, CUresult, DriverSymbol, (void*, p)) {
  Dispatch* dispatch = ActiveDispatch();
  if (dispatch == nullptr) return real(p);
  return static_cast<CUresult>(
      dispatch->HostDriver({Api::kCuMemFreeHost, V, p, 0, 0, caller}, nullptr, [&] { return int{real(p)}; }));
}

// ---- context teardown: the driver drops that context's registrations --------
#define CONTEXT_HOOK(NAME, PARAM_TYPE, ACTION)                        \
  HOOK(NAME, CUresult, DriverSymbol, (PARAM_TYPE, arg)) {             \
    if (Dispatch* dispatch = PublishedDispatch()) dispatch->ACTION;   \
    return real(arg);                                                 \
  }
CONTEXT_HOOK(cuCtxDestroy, CUcontext, BeforeContextDestroy(arg))
CONTEXT_HOOK(cuCtxDestroy_v2, CUcontext, BeforeContextDestroy(arg))
CONTEXT_HOOK(cuDevicePrimaryCtxReset, CUdevice, BeforePrimaryContextReset(arg, true))
CONTEXT_HOOK(cuDevicePrimaryCtxReset_v2, CUdevice, BeforePrimaryContextReset(arg, true))
// A release to 0 destroys the primary context, and the driver its registrations.
#define RELEASE_HOOK(NAME)                                                     \
  HOOK(NAME, CUresult, DriverSymbol, (CUdevice, device)) {                     \
    Dispatch* dispatch = PublishedDispatch();                                  \
    const Context primary = dispatch != nullptr                                \
        ? dispatch->BeforePrimaryContextReset(device, false) : nullptr;         \
    const CUresult result = real(device);                                      \
    if (dispatch != nullptr && result == CUDA_SUCCESS) {                       \
      dispatch->AfterPrimaryContextRelease(device, primary);                   \
    }                                                                          \
    return result;                                                             \
  }
RELEASE_HOOK(cuDevicePrimaryCtxRelease)
RELEASE_HOOK(cuDevicePrimaryCtxRelease_v2)

// ---- pointer queries: memory the program unregistered must look unregistered
// (Dispatch::QueryAddress), without losing what lazypin keeps there.
namespace lazypin {
namespace {
CUdeviceptr QueryAddress(CUdeviceptr ptr) {
  Dispatch* dispatch = PublishedDispatch();
  return dispatch != nullptr ? dispatch->QueryAddress(ptr) : ptr;
}
void* QueryAddress(void* p) {
  return reinterpret_cast<void*>(QueryAddress(static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p))));
}
// An answer about `asked` instead of `ptr`: a pointer it gives that is
// `asked` (the driver names unregistered memory's host pointer so) is `ptr`.
void AnswerAbout(CUpointer_attribute attribute, void* data, CUdeviceptr asked, CUdeviceptr ptr) {
  if (asked == ptr || data == nullptr) return;
  if (attribute == CU_POINTER_ATTRIBUTE_HOST_POINTER) {
    void** host = static_cast<void**>(data);
    if (reinterpret_cast<CUdeviceptr>(*host) == asked) *host = reinterpret_cast<void*>(ptr);
  } else if (attribute == CU_POINTER_ATTRIBUTE_DEVICE_POINTER ||
             attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) {
    CUdeviceptr* device = static_cast<CUdeviceptr*>(data);
    if (*device == asked) *device = ptr;
  }
}
}  // namespace
}  // namespace lazypin

HOOK(cuPointerGetAttribute, CUresult, DriverSymbol, (void*, data),
     (CUpointer_attribute, attribute), (CUdeviceptr, ptr)) {
  const CUdeviceptr asked = QueryAddress(ptr);
  const CUresult result = real(data, attribute, asked);
  if (result == CUDA_SUCCESS) AnswerAbout(attribute, data, asked, ptr);
  return result;
}

HOOK(cuPointerGetAttributes, CUresult, DriverSymbol, (unsigned int, count),
     (CUpointer_attribute*, attributes), (void**, data), (CUdeviceptr, ptr)) {
  const CUdeviceptr asked = QueryAddress(ptr);
  const CUresult result = real(count, attributes, data, asked);
  if (result == CUDA_SUCCESS && attributes != nullptr && data != nullptr) {
    for (unsigned int i = 0; i < count; ++i) AnswerAbout(attributes[i], data[i], asked, ptr);
  }
  return result;
}

HOOK(cuMemHostGetFlags, CUresult, DriverSymbol, (unsigned int*, flags), (void*, p)) {
  return real(flags, QueryAddress(p));
}

HOOK(cuMemHostGetDevicePointer_v2, CUresult, DriverSymbol, (CUdeviceptr*, dptr), (void*, p),
     (unsigned int, flags)) {
  return real(dptr, QueryAddress(p), flags);
}

// ---- the getter: hand back our hooks for the entry points we own -----------
HOOK(cuGetProcAddress, CUresult, DriverSymbol, (const char*, symbol), (void**, pfn), (int, version),
     (cuuint64_t, flags)) {
  const CUresult result = real(symbol, pfn, version, flags);
  if (result == CUDA_SUCCESS) SwapForHook(symbol, version, flags, pfn);
  return result;
}

HOOK(cuGetProcAddress_v2, CUresult, DriverSymbol, (const char*, symbol), (void**, pfn),
     (int, version), (cuuint64_t, flags), (CUdriverProcAddressQueryResult*, status)) {
  const CUresult result = real(symbol, pfn, version, flags, status);
  if (result == CUDA_SUCCESS) SwapForHook(symbol, version, flags, pfn);
  return result;
}


// ---- the doors: this file's table, then dlsym and the getter over every table
HOOK_TABLE(DoorHooks,
    ENTRY(cuMemHostRegister, "cuMemHostRegister", 0, 6049),
    ENTRY(cuMemHostRegister_v2, "cuMemHostRegister", 6050, INT_MAX),
    ENTRY(cuMemHostUnregister, "cuMemHostUnregister", 0, INT_MAX),
    ENTRY(cuMemHostAlloc, "cuMemHostAlloc", 0, INT_MAX),
    ENTRY(cuMemAllocHost, "cuMemAllocHost", 0, 3019),
    ENTRY(cuMemAllocHost_v2, "cuMemAllocHost", 3020, INT_MAX),
    ENTRY(cuMemFreeHost, "cuMemFreeHost", 0, INT_MAX),
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
    ENTRY(cuGetProcAddress_v2, "cuGetProcAddress", 12000, INT_MAX))

namespace lazypin {
namespace {
// Every table, this file's first. Called per lookup, not kept: a lookup may
// come before any constructor of this library ran.
template <typename Each>
const HookEntry* FindEntry(Each each) {
  const HookTable tables[] = {DoorHooks(), RuntimeHooks(), CopyHooks(), CaptureHooks(), GraphHooks()};
  for (const HookTable& table : tables) {
    for (size_t i = 0; i < table.count; ++i) {
      if (each(table.entries[i])) return &table.entries[i];
    }
  }
  return nullptr;
}

const HookEntry* FindByName(const char* name) {
  return FindEntry([name](const HookEntry& e) { return strcmp(e.name, name) == 0; });
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

void SwapForHook(const char* symbol, int version, uint64_t flags, void** pfn) {
  if (symbol == nullptr || pfn == nullptr || *pfn == nullptr || IsOurs(*pfn)) return;
  SetUpWithCuda(kHookSide);
  const HookEntry::Stream stream = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
                                       ? HookEntry::Stream::kPerThread
                                       : HookEntry::Stream::kLegacy;
  const HookEntry* e = FindEntry([&](const HookEntry& e) {
    return e.proc_name != nullptr && strcmp(e.proc_name, symbol) == 0 && version >= e.min_version &&
           version <= e.max_version && (e.stream == HookEntry::Stream::kAny || e.stream == stream);
  });
  if (e != nullptr && e->offer(Via::kGetProc, *pfn)) *pfn = e->hook(Via::kGetProc);
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
