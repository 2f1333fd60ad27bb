// libcudart_sim.cc: a simulated CUDA runtime (SONAME libcudart.so.13) for CPU tests.
//
// It reaches the driver exactly like the real libcudart does (measured on the
// H200): dlopen("libcuda.so.1", RTLD_NOW|RTLD_GLOBAL), dlsym(handle,
// "cuGetProcAddress_v2"), ask that getter for "cuGetProcAddress" (cudaVersion
// 11030, then 12000) and take every other driver entry point from the
// returned getter. It never links libcuda, so a dlsym override or a wrapped
// getter (the lazypin shim) sees every driver call the runtime makes.
//
// All exported symbols carry the version node libcudart.so.13
// (libcudart_sim.map), like the real library.

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "simcuda_common.h"

#undef cuGetProcAddress
#undef cuMemcpy2D
#undef cuMemcpy2DAsync
#undef cuMemcpy3D
#undef cuMemcpy3DAsync
#undef cuStreamBeginCapture
#undef cuGraphInstantiate

namespace {

// Driver entry points, typed from cuda.h's declarations.
#define SIMCUDA_DRIVER_FUNCS(X)                                   \
  X(cuInit, 2000)                                                 \
  X(cuDriverGetVersion, 2020)                                     \
  X(cuDeviceGet, 2000)                                            \
  X(cuDeviceGetCount, 2000)                                       \
  X(cuDeviceGetName, 2000)                                        \
  X(cuDeviceTotalMem_v2, 3020)                                    \
  X(cuDeviceGetAttribute, 2000)                                   \
  X(cuDevicePrimaryCtxRetain, 7000)                               \
  X(cuDevicePrimaryCtxRelease_v2, 11000)                          \
  X(cuDevicePrimaryCtxReset_v2, 11000)                            \
  X(cuCtxSetCurrent, 4000)                                        \
  X(cuCtxGetCurrent, 4000)                                        \
  X(cuCtxSynchronize, 2000)                                       \
  X(cuCtxGetDevice, 2000)                                         \
  X(cuDeviceCanAccessPeer, 4000)                                  \
  X(cuCtxEnablePeerAccess, 4000)                                  \
  X(cuCtxDisablePeerAccess, 4000)                                 \
  X(cuMemcpyPeer, 4000)                                           \
  X(cuMemcpyPeerAsync, 4000)                                      \
  X(cuMemHostRegister_v2, 6050)                                   \
  X(cuMemHostUnregister, 4000)                                    \
  X(cuMemHostGetDevicePointer_v2, 3020)                           \
  X(cuMemHostGetFlags, 2030)                                      \
  X(cuMemHostAlloc, 2020)                                         \
  X(cuMemAllocHost_v2, 3020)                                      \
  X(cuMemFreeHost, 2000)                                          \
  X(cuPointerGetAttribute, 4000)                                  \
  X(cuPointerGetAttributes, 7000)                                 \
  X(cuMemAlloc_v2, 3020)                                          \
  X(cuMemFree_v2, 3020)                                           \
  X(cuMemcpyHtoD_v2, 3020)                                        \
  X(cuMemcpyDtoH_v2, 3020)                                        \
  X(cuMemcpy, 4000)                                               \
  X(cuMemcpyAsync, 4000)                                          \
  X(cuMemsetD8_v2, 3020)                                          \
  X(cuMemsetD8Async, 3020)                                        \
  X(cuStreamCreate, 2000)                                         \
  X(cuStreamDestroy_v2, 4000)                                     \
  X(cuStreamSynchronize, 2000)                                    \
  X(cuStreamQuery, 2000)                                          \
  X(cuStreamWaitEvent, 3020)                                      \
  X(cuEventCreate, 2000)                                          \
  X(cuEventRecord, 2000)                                          \
  X(cuEventQuery, 2000)                                           \
  X(cuEventSynchronize, 2000)                                     \
  X(cuEventElapsedTime_v2, 12080)                                 \
  X(cuEventDestroy_v2, 4000)                                      \
  X(cuLaunchKernel, 4000)                                         \
  X(cuLaunchHostFunc, 10000)                                      \
  X(cuMemcpy2D_v2, 3020)                                          \
  X(cuMemcpy2DAsync_v2, 3020)                                     \
  X(cuMemcpy3D_v2, 3020)                                          \
  X(cuMemcpy3DAsync_v2, 3020)                                     \
  X(cuThreadExchangeStreamCaptureMode, 10010)                     \
  X(cuStreamBeginCapture_v2, 10010)                               \
  X(cuStreamEndCapture, 10000)                                    \
  X(cuStreamIsCapturing, 10000)                                   \
  X(cuGraphInstantiateWithFlags, 11040)                           \
  X(cuGraphLaunch, 10000)                                         \
  X(cuGraphCreate, 10000)                                         \
  X(cuGraphAddMemcpyNode, 10000)                                  \
  X(cuGraphDestroy, 10000)                                        \
  X(cuGraphExecDestroy, 10000)

// The getter is asked for the base name (no _vN suffix), like the real one.
std::string base_name(const char* sym) {
  std::string s(sym);
  size_t k = s.rfind("_v");
  if (k != std::string::npos && k + 2 < s.size() &&
      s.find_first_not_of("0123456789", k + 2) == std::string::npos)
    s.resize(k);
  return s;
}

struct Driver {
#define X(name, ver) decltype(&::name) name = nullptr;
  SIMCUDA_DRIVER_FUNCS(X)
#undef X
};

constexpr int kMaxDevices = 16;  // as the sim driver

struct Rt {
  std::once_flag once;
  cudaError_t load_err = cudaSuccess;
  Driver d;
  std::mutex mu;
  // Per device: its primary context, retained by the runtime, and the
  // generation a thread that made it current saw (unique over all devices).
  struct Dev {
    std::atomic<bool> retained{false};
    CUcontext primary = nullptr;
    std::atomic<int> gen{0};
  };
  Dev devs[kMaxDevices];
  int next_gen = 1;  // guarded by mu
  std::unordered_map<const void*, const char*> funcs;  // host stub -> device name
};

Rt& rt() {
  static Rt* p = new Rt;  // leaked: used from atexit (__cudaUnregisterFatBinary)
  return *p;
}

thread_local cudaError_t tls_last = cudaSuccess;
thread_local int tls_gen = 0;
thread_local int tls_dev = 0;  // the thread's device (cudaSetDevice)

struct LaunchConfig {
  dim3 grid, block;
  size_t shmem;
  cudaStream_t stream;
};
thread_local std::vector<LaunchConfig> tls_launch;

cudaError_t rec(cudaError_t e) {
  if (e != cudaSuccess) tls_last = e;
  return e;
}

// Driver and runtime codes coincide for everything the sim produces
// (1, 2, 3, 100, 101, 201, 400, 500, 600, 709, 712, 713, ...).
cudaError_t conv(CUresult r) { return static_cast<cudaError_t>(r); }

void load_driver() {
  Rt& r = rt();
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    r.load_err = cudaErrorInsufficientDriver;
    return;
  }
  using Getter = decltype(&::cuGetProcAddress_v2);
  auto gpa0 = reinterpret_cast<Getter>(dlsym(h, "cuGetProcAddress_v2"));
  if (!gpa0) {
    r.load_err = cudaErrorInsufficientDriver;
    return;
  }
  void* p = nullptr;
  CUdriverProcAddressQueryResult st;
  // Like the real cudart: first with 11030 (yields the 4-argument getter),
  // then with 12000 (yields cuGetProcAddress_v2), and use the latter.
  gpa0("cuGetProcAddress", &p, 11030, CU_GET_PROC_ADDRESS_DEFAULT, &st);
  p = nullptr;
  if (gpa0("cuGetProcAddress", &p, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS ||
      !p) {
    r.load_err = cudaErrorInsufficientDriver;
    return;
  }
  Getter gpa = reinterpret_cast<Getter>(p);
  bool ok = true;
#define X(name, ver)                                                                      \
  {                                                                                       \
    void* f = nullptr;                                                                    \
    CUdriverProcAddressQueryResult s2;                                                    \
    if (gpa(base_name(#name).c_str(), &f, ver, CU_GET_PROC_ADDRESS_DEFAULT, &s2) !=       \
            CUDA_SUCCESS ||                                                               \
        !f) {                                                                             \
      std::fprintf(stderr, "simcudart: driver entry point %s not found\n", #name);       \
      ok = false;                                                                         \
    }                                                                                     \
    r.d.name = reinterpret_cast<decltype(&::name)>(f);                                    \
  }
  SIMCUDA_DRIVER_FUNCS(X)
#undef X
  if (!ok) {
    r.load_err = cudaErrorInsufficientDriver;
    return;
  }
  CUresult rc = r.d.cuInit(0);
  if (rc != CUDA_SUCCESS) r.load_err = conv(rc);
}

// Driver loaded and initialized (no context).
cudaError_t ensure_driver() {
  std::call_once(rt().once, load_driver);
  return rt().load_err;
}

const Driver& D() { return rt().d; }

int device_count() {
  int n = 0;
  if (ensure_driver() != cudaSuccess || rt().d.cuDeviceGetCount(&n) != CUDA_SUCCESS) return 0;
  return n;
}

// Device `dev`'s primary context, retained by the runtime (once per lifetime).
cudaError_t primary_of(int dev, CUcontext* out, int* gen) {
  Rt& r = rt();
  if (dev < 0 || dev >= kMaxDevices) return cudaErrorInvalidDevice;
  Rt::Dev& d = r.devs[dev];
  std::lock_guard<std::mutex> l(r.mu);
  if (!d.retained) {
    CUresult rc = r.d.cuDevicePrimaryCtxRetain(&d.primary, dev);
    if (rc != CUDA_SUCCESS) return conv(rc);
    d.gen = r.next_gen++;
    d.retained = true;
  }
  *out = d.primary;
  if (gen) *gen = d.gen.load();
  return cudaSuccess;
}

// The thread's device's primary context retained and current on this thread
// (`force`: made current even when this thread did so before).
cudaError_t ensure_ctx(bool force = false) {
  if (cudaError_t e = ensure_driver()) return e;
  Rt& r = rt();
  Rt::Dev& d = r.devs[tls_dev];
  if (!force && tls_gen == d.gen.load() && d.retained) return cudaSuccess;
  CUcontext c = nullptr;
  int gen = 0;
  if (cudaError_t e = primary_of(tls_dev, &c, &gen)) return e;
  CUresult rc = r.d.cuCtxSetCurrent(c);
  if (rc != CUDA_SUCCESS) return conv(rc);
  tls_gen = gen;
  return cudaSuccess;
}

// The thread's device as the runtime sees it: the current context's, when
// one is current (cuCtxSetCurrent from the program), else cudaSetDevice's.
int current_device() {
  CUcontext c = nullptr;
  CUdevice d = 0;
  if (ensure_driver() == cudaSuccess && rt().d.cuCtxGetCurrent(&c) == CUDA_SUCCESS && c != nullptr &&
      rt().d.cuCtxGetDevice(&d) == CUDA_SUCCESS)
    return d;
  return tls_dev;
}

#define NEED_CTX()                                     \
  do {                                                 \
    if (cudaError_t e_ = ensure_ctx()) return rec(e_); \
  } while (0)
#define NEED_DRIVER()                                     \
  do {                                                    \
    if (cudaError_t e_ = ensure_driver()) return rec(e_); \
  } while (0)

CUdeviceptr dp(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

cudaError_t launch(const void* func, dim3 g, dim3 b, void** args, size_t shmem, cudaStream_t s) {
  NEED_CTX();
  if (func == nullptr) return rec(cudaErrorInvalidDeviceFunction);
  CUresult rc = D().cuLaunchKernel(reinterpret_cast<CUfunction>(const_cast<void*>(func)), g.x, g.y,
                                   g.z, b.x, b.y, b.z, static_cast<unsigned>(shmem), s, args,
                                   nullptr);
  if (rc == CUDA_ERROR_INVALID_VALUE) return rec(cudaErrorInvalidConfiguration);
  return rec(conv(rc));
}

struct RtErr {
  cudaError_t code;
  const char* name;
  const char* text;
};
const RtErr kRtErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
     "invalid configuration argument"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorMissingConfiguration, "cudaErrorMissingConfiguration",
     "__global__ function call is not configured"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorDeviceUninitialized, "cudaErrorDeviceUninitialized", "invalid device context"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorSymbolNotFound, "cudaErrorSymbolNotFound", "named symbol not found"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorContextIsDestroyed, "cudaErrorContextIsDestroyed", "context is destroyed"},
    {cudaErrorHostMemoryAlreadyRegistered, "cudaErrorHostMemoryAlreadyRegistered",
     "part or all of the requested memory range is already mapped"},
    {cudaErrorHostMemoryNotRegistered, "cudaErrorHostMemoryNotRegistered",
     "pointer does not correspond to a registered memory region"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorPeerAccessUnsupported, "cudaErrorPeerAccessUnsupported",
     "peer access is not supported between these two devices"},
    {cudaErrorPeerAccessAlreadyEnabled, "cudaErrorPeerAccessAlreadyEnabled",
     "peer access is already enabled"},
    {cudaErrorPeerAccessNotEnabled, "cudaErrorPeerAccessNotEnabled",
     "peer access has not been enabled"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation is not permitted when the stream is capturing"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {cudaErrorInvalidPitchValue, "cudaErrorInvalidPitchValue", "invalid pitch argument"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

}  // namespace

extern "C" {

// ------------------------------------------------------------- device ----
cudaError_t CUDARTAPI cudaDriverGetVersion(int* v) {
  if (!v) return rec(cudaErrorInvalidValue);
  std::call_once(rt().once, load_driver);
  if (!D().cuDriverGetVersion) {
    *v = 0;
    return cudaSuccess;
  }
  return rec(conv(D().cuDriverGetVersion(v)));
}

cudaError_t CUDARTAPI cudaRuntimeGetVersion(int* v) {
  if (!v) return rec(cudaErrorInvalidValue);
  *v = 13000;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGetDeviceCount(int* n) {
  if (!n) return rec(cudaErrorInvalidValue);
  if (cudaError_t e = ensure_driver()) {
    *n = 0;
    return rec(e == cudaErrorInsufficientDriver ? e : cudaErrorNoDevice);
  }
  return rec(conv(D().cuDeviceGetCount(n)));
}

// Makes `dev`'s primary context current on this thread (retained first),
// as CUDA 12+ does at once.
cudaError_t CUDARTAPI cudaSetDevice(int dev) {
  NEED_DRIVER();
  if (dev < 0 || dev >= device_count()) return rec(cudaErrorInvalidDevice);
  tls_dev = dev;
  return rec(ensure_ctx(/*force=*/true));
}

cudaError_t CUDARTAPI cudaGetDevice(int* dev) {
  if (!dev) return rec(cudaErrorInvalidValue);
  NEED_DRIVER();
  *dev = current_device();
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int dev) {
  if (!value) return rec(cudaErrorInvalidValue);
  NEED_DRIVER();
  if (dev < 0 || dev >= device_count()) return rec(cudaErrorInvalidDevice);
  return rec(conv(D().cuDeviceGetAttribute(value, static_cast<CUdevice_attribute>(attr), dev)));
}

cudaError_t CUDARTAPI cudaGetDeviceProperties(struct cudaDeviceProp* p, int dev) {
  if (!p) return rec(cudaErrorInvalidValue);
  NEED_DRIVER();
  if (dev < 0 || dev >= device_count()) return rec(cudaErrorInvalidDevice);
  std::memset(p, 0, sizeof(*p));
  D().cuDeviceGetName(p->name, sizeof(p->name), dev);
  D().cuDeviceTotalMem_v2(&p->totalGlobalMem, dev);
  auto A = [&](CUdevice_attribute a) {
    int v = 0;
    D().cuDeviceGetAttribute(&v, a, dev);
    return v;
  };
  p->sharedMemPerBlock = A(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK);
  p->regsPerBlock = A(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK);
  p->warpSize = A(CU_DEVICE_ATTRIBUTE_WARP_SIZE);
  p->memPitch = A(CU_DEVICE_ATTRIBUTE_MAX_PITCH);
  p->maxThreadsPerBlock = A(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  p->maxThreadsDim[0] = A(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X);
  p->maxThreadsDim[1] = A(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y);
  p->maxThreadsDim[2] = A(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z);
  p->maxGridSize[0] = A(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X);
  p->maxGridSize[1] = A(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y);
  p->maxGridSize[2] = A(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z);
  p->totalConstMem = A(CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY);
  p->major = A(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  p->minor = A(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  p->textureAlignment = A(CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT);
  p->multiProcessorCount = A(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  p->canMapHostMemory = A(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY);
  p->concurrentKernels = A(CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS);
  p->ECCEnabled = A(CU_DEVICE_ATTRIBUTE_ECC_ENABLED);
  p->pciBusID = A(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
  p->asyncEngineCount = A(CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT);
  p->unifiedAddressing = A(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING);
  p->memoryBusWidth = A(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH);
  p->l2CacheSize = A(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
  p->maxThreadsPerMultiProcessor = A(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR);
  p->managedMemory = A(CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY);
  p->concurrentManagedAccess = A(CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS);
  p->canUseHostPointerForRegisteredMem =
      A(CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM);
  p->sharedMemPerBlockOptin = A(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  p->sharedMemPerMultiprocessor = A(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
  p->regsPerMultiprocessor = A(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR);
  p->hostRegisterSupported = A(CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED);
  p->hostRegisterReadOnlySupported = A(CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED);
  p->maxBlocksPerMultiProcessor = A(CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR);
  p->cooperativeLaunch = A(CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH);
  p->memoryPoolsSupported = A(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaDeviceSynchronize(void) {
  NEED_CTX();
  return rec(conv(D().cuCtxSynchronize()));
}

// Resets the thread's device's primary context (the other devices' stay).
cudaError_t CUDARTAPI cudaDeviceReset(void) {
  NEED_DRIVER();
  Rt& r = rt();
  const int dev = current_device();
  CUresult rc = D().cuDevicePrimaryCtxReset_v2(dev);
  {
    std::lock_guard<std::mutex> l(r.mu);
    r.devs[dev].retained = false;
  }
  return rec(conv(rc));
}

// ------------------------------------------------------------- peers ----
cudaError_t CUDARTAPI cudaDeviceCanAccessPeer(int* can, int dev, int peer) {
  if (!can) return rec(cudaErrorInvalidValue);
  NEED_DRIVER();
  return rec(conv(D().cuDeviceCanAccessPeer(can, dev, peer)));
}

// The current device's context gets access to `peer`'s primary context
// (retained first, as cudart initializes the peer device).
cudaError_t CUDARTAPI cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  NEED_CTX();
  if (peer < 0 || peer >= device_count()) return rec(cudaErrorInvalidDevice);
  CUcontext pc = nullptr;
  if (cudaError_t e = primary_of(peer, &pc, nullptr)) return rec(e);
  return rec(conv(D().cuCtxEnablePeerAccess(pc, flags)));
}

cudaError_t CUDARTAPI cudaDeviceDisablePeerAccess(int peer) {
  NEED_CTX();
  if (peer < 0 || peer >= device_count()) return rec(cudaErrorInvalidDevice);
  CUcontext pc = nullptr;
  if (cudaError_t e = primary_of(peer, &pc, nullptr)) return rec(e);
  return rec(conv(D().cuCtxDisablePeerAccess(pc)));
}

namespace {
cudaError_t memcpy_peer(void* dst, int dst_dev, const void* src, int src_dev, size_t n,
                        cudaStream_t s, bool async) {
  NEED_CTX();
  const int count = device_count();
  if (dst_dev < 0 || dst_dev >= count || src_dev < 0 || src_dev >= count)
    return rec(cudaErrorInvalidDevice);
  if (n == 0) return cudaSuccess;
  CUcontext dc = nullptr, sc = nullptr;
  if (cudaError_t e = primary_of(dst_dev, &dc, nullptr)) return rec(e);
  if (cudaError_t e = primary_of(src_dev, &sc, nullptr)) return rec(e);
  return rec(conv(async ? D().cuMemcpyPeerAsync(dp(dst), dc, dp(src), sc, n, s)
                        : D().cuMemcpyPeer(dp(dst), dc, dp(src), sc, n)));
}
}  // namespace

cudaError_t CUDARTAPI cudaMemcpyPeer(void* dst, int dst_dev, const void* src, int src_dev,
                                     size_t n) {
  return memcpy_peer(dst, dst_dev, src, src_dev, n, nullptr, false);
}

cudaError_t CUDARTAPI cudaMemcpyPeerAsync(void* dst, int dst_dev, const void* src, int src_dev,
                                          size_t n, cudaStream_t s) {
  return memcpy_peer(dst, dst_dev, src, src_dev, n, s, true);
}

// ------------------------------------------------------------- errors ----
cudaError_t CUDARTAPI cudaGetLastError(void) {
  cudaError_t e = tls_last;
  tls_last = cudaSuccess;
  return e;
}

cudaError_t CUDARTAPI cudaPeekAtLastError(void) { return tls_last; }

const char* CUDARTAPI cudaGetErrorString(cudaError_t e) {
  for (const auto& x : kRtErrors)
    if (x.code == e) return x.text;
  return "unrecognized error code";
}

const char* CUDARTAPI cudaGetErrorName(cudaError_t e) {
  for (const auto& x : kRtErrors)
    if (x.code == e) return x.name;
  return "unrecognized error code";
}

// ------------------------------------------------------------- memory ----
cudaError_t CUDARTAPI cudaMalloc(void** p, size_t size) {
  if (!p) return rec(cudaErrorInvalidValue);
  NEED_CTX();
  if (size == 0) {
    *p = nullptr;
    return cudaSuccess;
  }
  CUdeviceptr d = 0;
  CUresult rc = D().cuMemAlloc_v2(&d, size);
  *p = reinterpret_cast<void*>(d);
  if (rc == CUDA_ERROR_OUT_OF_MEMORY) return rec(cudaErrorMemoryAllocation);
  return rec(conv(rc));
}

cudaError_t CUDARTAPI cudaFree(void* p) {
  NEED_CTX();
  if (p == nullptr) return cudaSuccess;  // cudaFree(0): just initializes
  return rec(conv(D().cuMemFree_v2(dp(p))));
}

cudaError_t CUDARTAPI cudaHostAlloc(void** p, size_t size, unsigned int flags) {
  if (!p) return rec(cudaErrorInvalidValue);
  NEED_CTX();
  CUresult rc = D().cuMemHostAlloc(p, size, flags);
  if (rc == CUDA_ERROR_OUT_OF_MEMORY) return rec(cudaErrorMemoryAllocation);
  return rec(conv(rc));
}

cudaError_t CUDARTAPI cudaMallocHost(void** p, size_t size) {
  if (!p) return rec(cudaErrorInvalidValue);
  NEED_CTX();
  CUresult rc = D().cuMemAllocHost_v2(p, size);
  if (rc == CUDA_ERROR_OUT_OF_MEMORY) return rec(cudaErrorMemoryAllocation);
  return rec(conv(rc));
}

cudaError_t CUDARTAPI cudaFreeHost(void* p) {
  NEED_CTX();
  if (p == nullptr) return cudaSuccess;
  return rec(conv(D().cuMemFreeHost(p)));
}

cudaError_t CUDARTAPI cudaHostRegister(void* ptr, size_t size, unsigned int flags) {
  NEED_CTX();
  return rec(conv(D().cuMemHostRegister_v2(ptr, size, flags)));
}

cudaError_t CUDARTAPI cudaHostUnregister(void* ptr) {
  NEED_CTX();
  return rec(conv(D().cuMemHostUnregister(ptr)));
}

cudaError_t CUDARTAPI cudaHostGetDevicePointer(void** pDevice, void* pHost, unsigned int flags) {
  if (!pDevice) return rec(cudaErrorInvalidValue);
  NEED_CTX();
  CUdeviceptr d = 0;
  CUresult rc = D().cuMemHostGetDevicePointer_v2(&d, pHost, flags);
  *pDevice = rc == CUDA_SUCCESS ? reinterpret_cast<void*>(d) : nullptr;
  return rec(conv(rc));
}

cudaError_t CUDARTAPI cudaHostGetFlags(unsigned int* pFlags, void* pHost) {
  if (!pFlags) return rec(cudaErrorInvalidValue);
  NEED_CTX();
  unsigned f = 0;
  CUresult rc = D().cuMemHostGetFlags(&f, pHost);
  if (rc == CUDA_SUCCESS) *pFlags = f;  // untouched on failure (measured)
  return rec(conv(rc));
}

cudaError_t CUDARTAPI cudaPointerGetAttributes(struct cudaPointerAttributes* a, const void* ptr) {
  if (!a) return rec(cudaErrorInvalidValue);
  NEED_CTX();
  unsigned type = 0;
  int ordinal = -2;
  CUdeviceptr devp = 0;
  void* hostp = nullptr;
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                 CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
                                 CU_POINTER_ATTRIBUTE_HOST_POINTER};
  void* data[] = {&type, &ordinal, &devp, &hostp};
  CUresult rc = D().cuPointerGetAttributes(4, attrs, data, dp(ptr));
  if (rc != CUDA_SUCCESS) return rec(conv(rc));
  if (type == CU_MEMORYTYPE_HOST) {
    a->type = cudaMemoryTypeHost;
  } else if (type == CU_MEMORYTYPE_DEVICE) {
    a->type = cudaMemoryTypeDevice;
  } else {
    // Unregistered host memory (measured): type 0, device -2, no device
    // pointer, and the driver's host pointer (the address asked about).
    a->type = cudaMemoryTypeUnregistered;
    a->device = -2;
    a->devicePointer = nullptr;
    a->hostPointer = hostp;
    return cudaSuccess;
  }
  a->device = ordinal;
  a->devicePointer = reinterpret_cast<void*>(devp);
  a->hostPointer = hostp;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  NEED_CTX();
  if (count == 0) return cudaSuccess;
  CUresult rc;
  switch (kind) {
    case cudaMemcpyHostToDevice:
      rc = D().cuMemcpyHtoD_v2(dp(dst), src, count);
      break;
    case cudaMemcpyDeviceToHost:
      rc = D().cuMemcpyDtoH_v2(dst, dp(src), count);
      break;
    case cudaMemcpyHostToHost:
    case cudaMemcpyDeviceToDevice:
    case cudaMemcpyDefault:
      rc = D().cuMemcpy(dp(dst), dp(src), count);
      break;
    default:
      return rec(cudaErrorInvalidMemcpyDirection);
  }
  return rec(conv(rc));
}

cudaError_t CUDARTAPI cudaMemcpyAsync(void* dst, const void* src, size_t count,
                                      enum cudaMemcpyKind kind, cudaStream_t stream) {
  NEED_CTX();
  if (static_cast<int>(kind) < 0 || static_cast<int>(kind) > cudaMemcpyDefault)
    return rec(cudaErrorInvalidMemcpyDirection);
  if (count == 0) return cudaSuccess;
  return rec(conv(D().cuMemcpyAsync(dp(dst), dp(src), count, stream)));
}

namespace {
// The driver's memory types for a runtime copy kind (UNIFIED: by address).
bool kind_types(cudaMemcpyKind kind, CUmemorytype* src, CUmemorytype* dst) {
  switch (kind) {
    case cudaMemcpyHostToHost: *src = *dst = CU_MEMORYTYPE_HOST; return true;
    case cudaMemcpyHostToDevice: *src = CU_MEMORYTYPE_HOST, *dst = CU_MEMORYTYPE_DEVICE; return true;
    case cudaMemcpyDeviceToHost: *src = CU_MEMORYTYPE_DEVICE, *dst = CU_MEMORYTYPE_HOST; return true;
    case cudaMemcpyDeviceToDevice: *src = *dst = CU_MEMORYTYPE_DEVICE; return true;
    case cudaMemcpyDefault: *src = *dst = CU_MEMORYTYPE_UNIFIED; return true;
    default: return false;
  }
}

void set_side(CUmemorytype t, const void* p, CUmemorytype* type, const void** host,
              CUdeviceptr* dev) {
  *type = t;
  if (t == CU_MEMORYTYPE_HOST)
    *host = p;
  else
    *dev = dp(p);
}

cudaError_t memcpy2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                     size_t height, cudaMemcpyKind kind, cudaStream_t s, bool async) {
  NEED_CTX();
  CUDA_MEMCPY2D c;
  std::memset(&c, 0, sizeof c);
  CUmemorytype st, dt;
  if (!kind_types(kind, &st, &dt)) return rec(cudaErrorInvalidMemcpyDirection);
  if (width == 0 || height == 0) return cudaSuccess;
  if (height > 1 && (spitch < width || dpitch < width)) return rec(cudaErrorInvalidPitchValue);
  set_side(st, src, &c.srcMemoryType, &c.srcHost, &c.srcDevice);
  void* dh = nullptr;
  set_side(dt, dst, &c.dstMemoryType, const_cast<const void**>(&dh), &c.dstDevice);
  c.dstHost = dh;
  c.srcPitch = spitch;
  c.dstPitch = dpitch;
  c.WidthInBytes = width;
  c.Height = height;
  return rec(conv(async ? D().cuMemcpy2DAsync_v2(&c, s) : D().cuMemcpy2D_v2(&c)));
}

cudaError_t memcpy3d(const cudaMemcpy3DParms* p, cudaStream_t s, bool async) {
  if (!p) return rec(cudaErrorInvalidValue);
  NEED_CTX();
  if (p->srcArray || p->dstArray) return rec(cudaErrorInvalidValue);  // arrays: not simulated
  CUmemorytype st, dt;
  if (!kind_types(p->kind, &st, &dt)) return rec(cudaErrorInvalidMemcpyDirection);
  if (p->extent.width == 0 || p->extent.height == 0 || p->extent.depth == 0) return cudaSuccess;
  CUDA_MEMCPY3D c;
  std::memset(&c, 0, sizeof c);
  set_side(st, p->srcPtr.ptr, &c.srcMemoryType, &c.srcHost, &c.srcDevice);
  void* dh = nullptr;
  set_side(dt, p->dstPtr.ptr, &c.dstMemoryType, const_cast<const void**>(&dh), &c.dstDevice);
  c.dstHost = dh;
  c.srcXInBytes = p->srcPos.x, c.srcY = p->srcPos.y, c.srcZ = p->srcPos.z;
  c.dstXInBytes = p->dstPos.x, c.dstY = p->dstPos.y, c.dstZ = p->dstPos.z;
  c.srcPitch = p->srcPtr.pitch, c.srcHeight = p->srcPtr.ysize;
  c.dstPitch = p->dstPtr.pitch, c.dstHeight = p->dstPtr.ysize;
  c.WidthInBytes = p->extent.width, c.Height = p->extent.height, c.Depth = p->extent.depth;
  return rec(conv(async ? D().cuMemcpy3DAsync_v2(&c, s) : D().cuMemcpy3D_v2(&c)));
}
}  // namespace

cudaError_t CUDARTAPI cudaMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch,
                                   size_t width, size_t height, enum cudaMemcpyKind kind) {
  return memcpy2d(dst, dpitch, src, spitch, width, height, kind, nullptr, false);
}

cudaError_t CUDARTAPI cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                                        size_t width, size_t height, enum cudaMemcpyKind kind,
                                        cudaStream_t stream) {
  return memcpy2d(dst, dpitch, src, spitch, width, height, kind, stream, true);
}

cudaError_t CUDARTAPI cudaMemcpy3D(const struct cudaMemcpy3DParms* p) {
  return memcpy3d(p, nullptr, false);
}

cudaError_t CUDARTAPI cudaMemcpy3DAsync(const struct cudaMemcpy3DParms* p, cudaStream_t stream) {
  return memcpy3d(p, stream, true);
}

cudaError_t CUDARTAPI cudaMemset(void* p, int value, size_t count) {
  NEED_CTX();
  return rec(conv(D().cuMemsetD8_v2(dp(p), static_cast<unsigned char>(value), count)));
}

cudaError_t CUDARTAPI cudaMemsetAsync(void* p, int value, size_t count, cudaStream_t s) {
  NEED_CTX();
  return rec(conv(D().cuMemsetD8Async(dp(p), static_cast<unsigned char>(value), count, s)));
}

// ---------------------------------------------------- streams / events ----
cudaError_t CUDARTAPI cudaStreamCreate(cudaStream_t* s) {
  if (!s) return rec(cudaErrorInvalidValue);
  NEED_CTX();
  return rec(conv(D().cuStreamCreate(s, 0)));
}

cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  if (!s || (flags & ~static_cast<unsigned>(cudaStreamNonBlocking))) return rec(cudaErrorInvalidValue);
  NEED_CTX();
  return rec(conv(D().cuStreamCreate(s, flags)));
}

cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t s) {
  NEED_CTX();
  return rec(conv(D().cuStreamDestroy_v2(s)));
}

cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t s) {
  NEED_CTX();
  return rec(conv(D().cuStreamSynchronize(s)));
}

cudaError_t CUDARTAPI cudaStreamQuery(cudaStream_t s) {
  NEED_CTX();
  CUresult rc = D().cuStreamQuery(s);
  if (rc == CUDA_ERROR_NOT_READY) return cudaErrorNotReady;  // not a sticky error
  return rec(conv(rc));
}

// ------------------------------------------------------ stream capture ----
cudaError_t CUDARTAPI cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode* mode) {
  if (!mode) return rec(cudaErrorInvalidValue);
  NEED_DRIVER();
  return rec(conv(D().cuThreadExchangeStreamCaptureMode(reinterpret_cast<CUstreamCaptureMode*>(mode))));
}

cudaError_t CUDARTAPI cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode) {
  NEED_CTX();
  return rec(conv(D().cuStreamBeginCapture_v2(s, static_cast<CUstreamCaptureMode>(mode))));
}

cudaError_t CUDARTAPI cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  if (!graph) return rec(cudaErrorInvalidValue);
  NEED_CTX();
  return rec(conv(D().cuStreamEndCapture(s, graph)));
}

cudaError_t CUDARTAPI cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus* status) {
  if (!status) return rec(cudaErrorInvalidValue);
  NEED_CTX();
  return rec(conv(D().cuStreamIsCapturing(s, reinterpret_cast<CUstreamCaptureStatus*>(status))));
}

cudaError_t CUDARTAPI cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                           unsigned long long flags) {
  NEED_CTX();
  return rec(conv(D().cuGraphInstantiateWithFlags(exec, graph, flags)));
}

cudaError_t CUDARTAPI cudaGraphInstantiateWithFlags(cudaGraphExec_t* exec, cudaGraph_t graph,
                                                    unsigned long long flags) {
  return cudaGraphInstantiate(exec, graph, flags);
}

cudaError_t CUDARTAPI cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  NEED_CTX();
  return rec(conv(D().cuGraphLaunch(exec, s)));
}

cudaError_t CUDARTAPI cudaGraphCreate(cudaGraph_t* graph, unsigned int flags) {
  NEED_CTX();
  return rec(conv(D().cuGraphCreate(graph, flags)));
}

// A 1D copy node: one row of unified addresses (cudaMemcpyDefault's rules).
cudaError_t CUDARTAPI cudaGraphAddMemcpyNode1D(cudaGraphNode_t* node, cudaGraph_t graph,
                                               const cudaGraphNode_t* deps, size_t count, void* dst,
                                               const void* src, size_t bytes, enum cudaMemcpyKind kind) {
  (void)kind;
  NEED_CTX();
  CUDA_MEMCPY3D c;
  std::memset(&c, 0, sizeof c);
  c.srcMemoryType = CU_MEMORYTYPE_UNIFIED;
  c.srcDevice = reinterpret_cast<CUdeviceptr>(src);
  c.dstMemoryType = CU_MEMORYTYPE_UNIFIED;
  c.dstDevice = reinterpret_cast<CUdeviceptr>(dst);
  c.WidthInBytes = bytes;
  c.Height = 1;
  c.Depth = 1;
  CUcontext ctx = nullptr;
  D().cuCtxGetCurrent(&ctx);
  return rec(conv(D().cuGraphAddMemcpyNode(node, graph, deps, count, &c, ctx)));
}

cudaError_t CUDARTAPI cudaGraphDestroy(cudaGraph_t graph) {
  NEED_CTX();
  return rec(conv(D().cuGraphDestroy(graph)));
}

cudaError_t CUDARTAPI cudaGraphExecDestroy(cudaGraphExec_t exec) {
  NEED_CTX();
  return rec(conv(D().cuGraphExecDestroy(exec)));
}

cudaError_t CUDARTAPI cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  NEED_CTX();
  return rec(conv(D().cuStreamWaitEvent(s, e, flags)));
}

cudaError_t CUDARTAPI cudaEventCreate(cudaEvent_t* e) {
  if (!e) return rec(cudaErrorInvalidValue);
  NEED_CTX();
  return rec(conv(D().cuEventCreate(e, 0)));
}

cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  if (!e || (flags & ~0xFu)) return rec(cudaErrorInvalidValue);
  NEED_CTX();
  return rec(conv(D().cuEventCreate(e, flags)));
}

cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  NEED_CTX();
  return rec(conv(D().cuEventRecord(e, s)));
}

cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t e) {
  NEED_CTX();
  return rec(conv(D().cuEventSynchronize(e)));
}

cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t e) {
  NEED_CTX();
  CUresult rc = D().cuEventQuery(e);
  if (rc == CUDA_ERROR_NOT_READY) return cudaErrorNotReady;
  return rec(conv(rc));
}

cudaError_t CUDARTAPI cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  NEED_CTX();
  CUresult rc = D().cuEventElapsedTime_v2(ms, a, b);
  if (rc == CUDA_ERROR_NOT_READY) return cudaErrorNotReady;
  return rec(conv(rc));
}

cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t e) {
  NEED_CTX();
  return rec(conv(D().cuEventDestroy_v2(e)));
}

// ------------------------------------------------------------ kernels ----
// Kernel bodies never run: a launch occupies the stream for SIMCUDA_KERNEL_US.
// Any non-null function pointer is accepted (so plain C++ tests can launch
// "kernels" to make the device busy).
cudaError_t CUDARTAPI cudaLaunchKernel(const void* func, dim3 g, dim3 b, void** args, size_t shmem,
                                       cudaStream_t s) {
  return launch(func, g, b, args, shmem, s);
}
cudaError_t CUDARTAPI cudaLaunchKernel_ptsz(const void* func, dim3 g, dim3 b, void** args,
                                            size_t shmem, cudaStream_t s) {
  return launch(func, g, b, args, shmem, s);
}

cudaError_t CUDARTAPI cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* data) {
  NEED_CTX();
  return rec(conv(D().cuLaunchHostFunc(s, fn, data)));
}

cudaError_t CUDARTAPI cudaFuncGetAttributes(struct cudaFuncAttributes* attr, const void* func) {
  if (!attr) return rec(cudaErrorInvalidValue);
  NEED_DRIVER();
  if (!func) return rec(cudaErrorInvalidDeviceFunction);
  std::memset(attr, 0, sizeof(*attr));
  attr->maxThreadsPerBlock = 1024;
  attr->numRegs = 32;
  attr->ptxVersion = 90;
  attr->binaryVersion = 90;
  attr->maxDynamicSharedSizeBytes = 49152;
  return cudaSuccess;
}

// -------------------------------- nvcc host-code entry points (fatbin) ----
void** CUDARTAPI __cudaRegisterFatBinary(void* fatCubin) {
  void** h = new void*[1];
  h[0] = fatCubin;
  return h;
}

void CUDARTAPI __cudaRegisterFatBinaryEnd(void** fatCubinHandle) { (void)fatCubinHandle; }

void CUDARTAPI __cudaUnregisterFatBinary(void** fatCubinHandle) {
  (void)fatCubinHandle;  // leaked on purpose: runs from atexit
}

void CUDARTAPI __cudaRegisterFunction(void** fatCubinHandle, const char* hostFun, char* deviceFun,
                                      const char* deviceName, int thread_limit, uint3* tid,
                                      uint3* bid, dim3* bDim, dim3* gDim, int* wSize) {
  (void)fatCubinHandle, (void)deviceFun, (void)thread_limit, (void)tid, (void)bid, (void)bDim,
      (void)gDim, (void)wSize;
  std::lock_guard<std::mutex> l(rt().mu);
  rt().funcs[hostFun] = deviceName;
}

void CUDARTAPI __cudaRegisterVar(void** fatCubinHandle, char* hostVar, char* deviceAddress,
                                 const char* deviceName, int ext, size_t size, int constant,
                                 int global) {
  (void)fatCubinHandle, (void)hostVar, (void)deviceAddress, (void)deviceName, (void)ext,
      (void)size, (void)constant, (void)global;
}

void CUDARTAPI __cudaRegisterManagedVar(void** fatCubinHandle, void** hostVarPtrAddress,
                                        char* deviceAddress, const char* deviceName, int ext,
                                        size_t size, int constant, int global) {
  (void)fatCubinHandle, (void)hostVarPtrAddress, (void)deviceAddress, (void)deviceName, (void)ext,
      (void)size, (void)constant, (void)global;
}

char CUDARTAPI __cudaInitModule(void** fatCubinHandle) {
  (void)fatCubinHandle;
  return 1;
}

unsigned CUDARTAPI __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem,
                                               struct CUstream_st* stream) {
  tls_launch.push_back({gridDim, blockDim, sharedMem, stream});
  return 0;
}

cudaError_t CUDARTAPI __cudaPopCallConfiguration(dim3* gridDim, dim3* blockDim, size_t* sharedMem,
                                                 void* stream) {
  if (tls_launch.empty()) return rec(cudaErrorMissingConfiguration);
  LaunchConfig c = tls_launch.back();
  tls_launch.pop_back();
  *gridDim = c.grid;
  *blockDim = c.block;
  *sharedMem = c.shmem;
  *static_cast<cudaStream_t*>(stream) = c.stream;
  return cudaSuccess;
}

// CUDA 13 host stubs resolve a kernel handle once, then launch through it.
cudaError_t CUDARTAPI __cudaGetKernel(cudaKernel_t* kernel, const void* hostFun) {
  if (!kernel) return cudaErrorInvalidValue;
  *kernel = reinterpret_cast<cudaKernel_t>(const_cast<void*>(hostFun));
  return hostFun ? cudaSuccess : cudaErrorInvalidDeviceFunction;
}

cudaError_t CUDARTAPI __cudaLaunchKernel(cudaKernel_t kernel, dim3 g, dim3 b, void** args,
                                         size_t shmem, cudaStream_t s) {
  return launch(reinterpret_cast<const void*>(kernel), g, b, args, shmem, s);
}
cudaError_t CUDARTAPI __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 g, dim3 b, void** args,
                                              size_t shmem, cudaStream_t s) {
  return launch(reinterpret_cast<const void*>(kernel), g, b, args, shmem, s);
}

}  // extern "C"
