// path_linked.cu: the path_* call sequence through the driver API, linked
// against libcuda (CUDA::cuda_driver: -lcuda): cuInit, cuDeviceGet,
// cuDevicePrimaryCtxRetain, cuCtxSetCurrent, then cuMemHostRegister (the header
// maps it to cuMemHostRegister_v2) and cuMemHostUnregister.
//
// CLI: path_linked   (no options)
// Prints the CALL lines of path_seq.h and "DONE calls=<n>"; "PATH linked" on
// stderr. Exits 0 (setup failures exit 1).
#include <cuda.h>

#include "path_seq.h"


int main() {
  CUdevice dev;
  CUcontext ctx;
  CU_CHECK(cuInit(0));
  CU_CHECK(cuDeviceGet(&dev, 0));
  CU_CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CU_CHECK(cuCtxSetCurrent(ctx));
  int rc = pathseq::run(
      "linked",
      [](void* p, size_t n, unsigned f) { return static_cast<int>(cuMemHostRegister(p, n, f)); },
      [](void* p) { return static_cast<int>(cuMemHostUnregister(p)); });
  CU_CHECK(cuCtxSetCurrent(nullptr));
  CU_CHECK(cuDevicePrimaryCtxRelease(dev));
  return rc;
}
