// simcuda_driver_app.cc: a driver-API program linked against the toolkit's
// stub libcuda.so; run with LD_LIBRARY_PATH=<build>/simcuda it gets the sim.
#include <cuda.h>

#include <cstdio>
#include <cstring>

#define CHECK(x)                                                           \
  do {                                                                     \
    CUresult r_ = (x);                                                     \
    if (r_ != CUDA_SUCCESS) {                                              \
      std::fprintf(stderr, "%s failed: %d\n", #x, static_cast<int>(r_));   \
      return 1;                                                            \
    }                                                                      \
  } while (0)

int main() {
  CHECK(cuInit(0));
  CUdevice dev;
  CHECK(cuDeviceGet(&dev, 0));
  char name[64];
  CHECK(cuDeviceGetName(name, sizeof name, dev));
  CUcontext ctx;
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  static char host[8192], back[8192];
  for (size_t i = 0; i < sizeof host; ++i) host[i] = static_cast<char>(i * 7);
  CHECK(cuMemHostRegister(host, sizeof host, CU_MEMHOSTREGISTER_PORTABLE));
  if (cuMemHostRegister(host + 100, 10, 0) != CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) return 2;
  CUdeviceptr d;
  CHECK(cuMemAlloc(&d, sizeof host));
  CHECK(cuMemcpyHtoD(d, host, sizeof host));
  CHECK(cuMemcpyDtoH(back, d, sizeof back));
  if (std::memcmp(host, back, sizeof host) != 0) return 3;
  CHECK(cuMemFree(d));
  if (cuMemHostUnregister(host + 1) != CUDA_ERROR_INVALID_VALUE) return 4;
  CHECK(cuMemHostUnregister(host));
  if (cuMemHostUnregister(host) != CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED) return 5;
  CHECK(cuDevicePrimaryCtxRelease(dev));
  std::printf("%s: SIMCUDA_DRIVER_APP_OK\n", name);
  return 0;
}
