// path_dlsym.cc: the path_* call sequence at driver level, with every entry
// point taken by dlsym from dlopen("libcuda.so.1"): cuInit, cuDeviceGet,
// cuDevicePrimaryCtxRetain/Release, cuCtxSetCurrent, cuMemHostRegister_v2,
// cuMemHostUnregister. Plain C++ (no nvcc), links only -ldl; uses cuda.h for
// the types.
//
// CLI: path_dlsym   (no options)
// Prints the CALL lines of path_seq.h and "DONE calls=<n>"; "PATH dlsym" on
// stderr. Exits 0 (setup failures exit 1).
#include <cuda.h>
#include <dlfcn.h>

#include "path_seq.h"

namespace {

typedef CUresult (*PFN_Init)(unsigned int);
typedef CUresult (*PFN_DeviceGet)(CUdevice*, int);
typedef CUresult (*PFN_PrimaryCtxRetain)(CUcontext*, CUdevice);
typedef CUresult (*PFN_PrimaryCtxRelease)(CUdevice);
typedef CUresult (*PFN_CtxSetCurrent)(CUcontext);
typedef CUresult (*PFN_HostRegister)(void*, size_t, unsigned int);
typedef CUresult (*PFN_HostUnregister)(void*);

PFN_HostRegister g_reg;
PFN_HostUnregister g_unreg;

void* sym(void* h, const char* name) {
  void* p = dlsym(h, name);
  if (!p) {
    std::fprintf(stderr, "dlsym(%s) failed: %s\n", name, dlerror());
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
  auto init = reinterpret_cast<PFN_Init>(sym(h, "cuInit"));
  auto device_get = reinterpret_cast<PFN_DeviceGet>(sym(h, "cuDeviceGet"));
  auto retain = reinterpret_cast<PFN_PrimaryCtxRetain>(sym(h, "cuDevicePrimaryCtxRetain"));
  auto release = reinterpret_cast<PFN_PrimaryCtxRelease>(sym(h, "cuDevicePrimaryCtxRelease"));
  auto set_current = reinterpret_cast<PFN_CtxSetCurrent>(sym(h, "cuCtxSetCurrent"));
  g_reg = reinterpret_cast<PFN_HostRegister>(sym(h, "cuMemHostRegister_v2"));
  g_unreg = reinterpret_cast<PFN_HostUnregister>(sym(h, "cuMemHostUnregister"));

  CUdevice dev;
  CUcontext ctx;
  CU_CHECK(init(0));
  CU_CHECK(device_get(&dev, 0));
  CU_CHECK(retain(&ctx, dev));
  CU_CHECK(set_current(ctx));
  int rc = pathseq::run(
      "dlsym", [](void* p, size_t n, unsigned f) { return static_cast<int>(g_reg(p, n, f)); },
      [](void* p) { return static_cast<int>(g_unreg(p)); });
  CU_CHECK(set_current(nullptr));
  CU_CHECK(release(dev));
  return rc;
}
