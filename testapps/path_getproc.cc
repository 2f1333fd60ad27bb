// path_getproc.cc: the path_* call sequence at driver level, the way static
// cudart and cuda-python reach the driver: dlopen("libcuda.so.1"),
// dlsym(h, "cuGetProcAddress_v2"), ask THAT for "cuGetProcAddress"
// (cudaVersion 12000), and take every other entry point from the returned
// getter: cuInit, cuDeviceGet, cuDevicePrimaryCtxRetain/Release, cuCtxSetCurrent
// (12000), cuMemHostRegister (6050, which yields cuMemHostRegister_v2) and
// cuMemHostUnregister (4000). Plain C++ (no nvcc), links only -ldl.
//
// CLI: path_getproc   (no options)
// Prints the CALL lines of path_seq.h and "DONE calls=<n>"; "PATH getproc" and
// the symbol-status codes on stderr. Exits 0 (setup failures exit 1).
#include <cuda.h>
#include <dlfcn.h>

#include "path_seq.h"

namespace {

typedef CUresult (*PFN_GetProc)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
typedef CUresult (*PFN_Init)(unsigned int);
typedef CUresult (*PFN_DeviceGet)(CUdevice*, int);
typedef CUresult (*PFN_PrimaryCtxRetain)(CUcontext*, CUdevice);
typedef CUresult (*PFN_PrimaryCtxRelease)(CUdevice);
typedef CUresult (*PFN_CtxSetCurrent)(CUcontext);
typedef CUresult (*PFN_HostRegister)(void*, size_t, unsigned int);
typedef CUresult (*PFN_HostUnregister)(void*);

PFN_HostRegister g_reg;
PFN_HostUnregister g_unreg;
PFN_GetProc g_get;

void* get(const char* name, int version) {
  void* p = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  CUresult r = g_get(name, &p, version, CU_GET_PROC_ADDRESS_DEFAULT, &status);
  if (r != CUDA_SUCCESS || !p || status != CU_GET_PROC_ADDRESS_SUCCESS) {
    std::fprintf(stderr, "cuGetProcAddress(%s, %d) -> %d status %d\n", name, version,
                 static_cast<int>(r), static_cast<int>(status));
    std::exit(1);
  }
  return p;
}


}  // namespace

int main() {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    std::fprintf(stderr, "dlopen(libcuda.so.1) failed: %s\n", dlerror());
    return 1;
  }
  g_get = reinterpret_cast<PFN_GetProc>(dlsym(h, "cuGetProcAddress_v2"));
  if (!g_get) {
    std::fprintf(stderr, "dlsym(cuGetProcAddress_v2) failed: %s\n", dlerror());
    return 1;
  }
  // The getter as the driver hands it out (what static cudart does).
  g_get = reinterpret_cast<PFN_GetProc>(get("cuGetProcAddress", 12000));
  auto init = reinterpret_cast<PFN_Init>(get("cuInit", 12000));
  auto device_get = reinterpret_cast<PFN_DeviceGet>(get("cuDeviceGet", 12000));
  auto retain = reinterpret_cast<PFN_PrimaryCtxRetain>(get("cuDevicePrimaryCtxRetain", 12000));
  auto release = reinterpret_cast<PFN_PrimaryCtxRelease>(get("cuDevicePrimaryCtxRelease", 12000));
  auto set_current = reinterpret_cast<PFN_CtxSetCurrent>(get("cuCtxSetCurrent", 12000));
  g_reg = reinterpret_cast<PFN_HostRegister>(get("cuMemHostRegister", 6050));
  g_unreg = reinterpret_cast<PFN_HostUnregister>(get("cuMemHostUnregister", 4000));

  CUdevice dev;
  CUcontext ctx;
  CU_CHECK(init(0));
  CU_CHECK(device_get(&dev, 0));
  CU_CHECK(retain(&ctx, dev));
  CU_CHECK(set_current(ctx));
  int rc = pathseq::run(
      "getproc", [](void* p, size_t n, unsigned f) { return static_cast<int>(g_reg(p, n, f)); },
      [](void* p) { return static_cast<int>(g_unreg(p)); });
  CU_CHECK(set_current(nullptr));
  CU_CHECK(release(dev));
  return rc;
}
