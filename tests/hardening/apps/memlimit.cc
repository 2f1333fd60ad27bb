// memlimit.cc: built as apps/memlimit/libcuda.so.1, a thin stand-in driver
// that forwards to the simulated driver (SIMCUDA_DRIVER, an absolute path) and
// limits how many bytes may be registered at once (MEMLIMIT_BYTES): a
// cuMemHostRegister that would exceed it fails with CUDA_ERROR_OUT_OF_MEMORY
// (2), as the real driver does when it cannot pin more. The simulated driver
// has no such switch. Put its directory first on LD_LIBRARY_PATH.
// Exports the getter (how cudart reaches the driver) and the few entry points
// lazypin looks up by name; everything else comes from the sim's getter.
#include <cuda.h>
#include <dlfcn.h>
#undef cuMemHostRegister
#undef cuGetProcAddress

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

namespace {

void* Sim(const char* name) {
  static void* h = [] {
    const char* path = std::getenv("SIMCUDA_DRIVER");
    void* handle = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : nullptr;
    if (!handle) {
      std::fprintf(stderr, "memlimit: cannot load SIMCUDA_DRIVER=%s: %s\n", path ? path : "",
                   dlerror());
      std::abort();
    }
    return handle;
  }();
  // glibc's own dlsym, so that a preloaded dlsym hook (lazypin's) does not
  // see this lookup. MEMLIMIT_PLAIN_DLSYM=1 uses the plain dlsym instead, as
  // a naive layered driver would (test_hardening: the layered-driver case).
  using DlsymFn = void* (*)(void*, const char*);
  static DlsymFn lookup = []() -> DlsymFn {
    if (const char* v = std::getenv("MEMLIMIT_PLAIN_DLSYM"); v && v[0] == '1') return &dlsym;
    auto f = reinterpret_cast<DlsymFn>(dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34"));
    if (!f) f = reinterpret_cast<DlsymFn>(dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.2.5"));
    return f ? f : &dlsym;
  }();
  return lookup(h, name);
}

std::mutex g_mu;
std::map<void*, size_t> g_regs;
size_t g_total = 0;
size_t Limit() {
  static size_t limit = [] {
    const char* v = std::getenv("MEMLIMIT_BYTES");
    return v ? std::strtoull(v, nullptr, 0) : ~size_t{0};
  }();
  return limit;
}

using RegFn = CUresult (*)(void*, size_t, unsigned);
using UnregFn = CUresult (*)(void*);
using GetProcFn = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

CUresult Register(void* p, size_t bytes, unsigned flags) {
  static auto real = reinterpret_cast<RegFn>(Sim("cuMemHostRegister_v2"));
  {
    std::lock_guard<std::mutex> l(g_mu);
    if (bytes > Limit() || g_total > Limit() - bytes) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  CUresult rc = real(p, bytes, flags);
  if (rc == CUDA_SUCCESS) {
    std::lock_guard<std::mutex> l(g_mu);
    g_regs[p] = bytes;
    g_total += bytes;
  }
  return rc;
}

CUresult Unregister(void* p) {
  static auto real = reinterpret_cast<UnregFn>(Sim("cuMemHostUnregister"));
  CUresult rc = real(p);
  if (rc == CUDA_SUCCESS) {
    std::lock_guard<std::mutex> l(g_mu);
    auto it = g_regs.find(p);
    if (it != g_regs.end()) {
      g_total -= it->second;
      g_regs.erase(it);
    }
  }
  return rc;
}

}  // namespace

#define EXPORT extern "C" __attribute__((visibility("default")))

EXPORT CUresult cuMemHostRegister_v2(void* p, size_t bytes, unsigned flags) {
  return Register(p, bytes, flags);
}
EXPORT CUresult cuMemHostRegister(void* p, size_t bytes, unsigned flags) {
  return Register(p, bytes, flags);
}
EXPORT CUresult cuMemHostUnregister(void* p) { return Unregister(p); }

EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                                    cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
  static auto real = reinterpret_cast<GetProcFn>(Sim("cuGetProcAddress_v2"));
  CUresult rc = real(symbol, pfn, version, flags, status);
  if (rc == CUDA_SUCCESS && pfn && symbol) {
    const std::string name = symbol;
    if (name == "cuMemHostRegister") *pfn = reinterpret_cast<void*>(&Register);
    else if (name == "cuMemHostUnregister") *pfn = reinterpret_cast<void*>(&Unregister);
    else if (name == "cuGetProcAddress" && version >= 12000)
      *pfn = reinterpret_cast<void*>(&cuGetProcAddress_v2);
  }
  return rc;
}

// Plain forwarders for what lazypin and the runtime look up by name.
#define FORWARD(name, params, args)                                  \
  EXPORT CUresult name params {                                      \
    static auto real = reinterpret_cast<CUresult(*) params>(Sim(#name)); \
    return real args;                                                \
  }
FORWARD(cuInit, (unsigned f), (f))
FORWARD(cuDriverGetVersion, (int* v), (v))
FORWARD(cuCtxGetCurrent, (CUcontext* c), (c))
FORWARD(cuCtxGetDevice, (CUdevice* d), (d))
FORWARD(cuCtxPushCurrent_v2, (CUcontext c), (c))
FORWARD(cuCtxPopCurrent_v2, (CUcontext* c), (c))
FORWARD(cuCtxSynchronize, (), ())
FORWARD(cuStreamSynchronize, (CUstream s), (s))
FORWARD(cuStreamIsCapturing, (CUstream s, CUstreamCaptureStatus* status), (s, status))
FORWARD(cuThreadExchangeStreamCaptureMode, (CUstreamCaptureMode* mode), (mode))
FORWARD(cuDevicePrimaryCtxGetState, (CUdevice d, unsigned* flags, int* active), (d, flags, active))
