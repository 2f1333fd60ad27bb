// simcuda_test.cc: tests of the simulated CUDA driver and runtime.
//
// Sleeping is off (SIMCUDA_SLEEP=0) unless a test turns it on through
// setenv + simcuda_reload_env(). Stale-detection tests need root (pagemap
// PFNs) and GTEST_SKIP otherwise.

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#undef cuGetProcAddress
#undef cuMemHostRegister

// Legacy entry points the sim exports but cuda.h hides behind macros.
extern "C" CUresult CUDAAPI cuMemHostRegister(void* p, size_t bytesize, unsigned int Flags);
extern "C" CUresult CUDAAPI cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev);
#undef cuMemcpy2DAsync

namespace {

cudaPitchedPtr pitched(void* p, size_t pitch, size_t xsize, size_t ysize) {
  cudaPitchedPtr r;
  r.ptr = p, r.pitch = pitch, r.xsize = xsize, r.ysize = ysize;
  return r;
}

const size_t kPg = static_cast<size_t>(sysconf(_SC_PAGESIZE));

// Sim diagnostics, looked up with dlsym like the lead's tests would.
template <typename F>
F sim_fn(const char* name) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  void* p = h ? dlsym(h, name) : nullptr;
  if (!p) {
    ADD_FAILURE() << "missing " << name;
    std::abort();
  }
  return reinterpret_cast<F>(p);
}
unsigned long stale_count() { return sim_fn<unsigned long (*)()>("simcuda_stale_count")(); }
unsigned long checked_pages() { return sim_fn<unsigned long (*)()>("simcuda_checked_pages")(); }
void reload_env() { sim_fn<void (*)()>("simcuda_reload_env")(); }
int stale_enabled() { return sim_fn<int (*)()>("simcuda_stale_detection_enabled")(); }
unsigned long live_regs() { return sim_fn<unsigned long (*)()>("simcuda_live_registrations")(); }

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Restores the env switches after a test that changes them.
struct EnvGuard {
  ~EnvGuard() {
    setenv("SIMCUDA_SLEEP", "0", 1);
    unsetenv("SIMCUDA_SLEEP_SCALE");
    unsetenv("SIMCUDA_KERNEL_US");
    unsetenv("SIMCUDA_STALE");
    reload_env();
  }
};

void* map_pages(size_t n) {
  void* p = mmap(nullptr, n * kPg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  EXPECT_NE(p, MAP_FAILED);
  return p;
}

// Driver-API fixture: the primary context is current on the test thread.
class Driver : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(cuDevicePrimaryCtxRetain(&ctx_, 0), CUDA_SUCCESS);
    ASSERT_EQ(cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
  }
  void TearDown() override { cuDevicePrimaryCtxRelease_v2(0); }
  CUcontext ctx_ = nullptr;
};

class Stale : public Driver {
 protected:
  void SetUp() override {
    Driver::SetUp();
    if (!stale_enabled()) GTEST_SKIP() << "needs root to read /proc/self/pagemap PFNs";
    // Without pinning, a remapped page may get its old frame back (missed).
    if (!sim_fn<int (*)()>("simcuda_pinning_enabled")())
      GTEST_SKIP() << "io_uring pinning unavailable (SIMCUDA_PIN=0 or seccomp)";
  }
};

// ------------------------------------------------------------ driver ----
TEST(DriverInit, CallsBeforeCuInitFail) {
  // Fresh process (threadsafe death-test style re-executes the binary).
  EXPECT_EXIT(
      {
        static char buf[4096];
        int n = 0;
        bool ok = cuMemHostRegister_v2(buf, sizeof buf, 0) == CUDA_ERROR_NOT_INITIALIZED &&
                  cuDeviceGetCount(&n) == CUDA_ERROR_NOT_INITIALIZED;
        int v = 0;
        ok = ok && cuDriverGetVersion(&v) == CUDA_SUCCESS && v == 13000;
        std::exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(DriverInit, NoCurrentContextIs201) {
  ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
  std::thread([] {
    static char buf[4096];
    EXPECT_EQ(cuMemHostRegister_v2(buf, sizeof buf, 0), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(cuMemHostUnregister(buf), CUDA_ERROR_INVALID_CONTEXT);
    CUcontext c = reinterpret_cast<CUcontext>(1);
    EXPECT_EQ(cuCtxGetCurrent(&c), CUDA_SUCCESS);
    EXPECT_EQ(c, nullptr);
  }).join();
}

TEST_F(Driver, DeviceQueries) {
  int n = 0, v = 0;
  EXPECT_EQ(cuDeviceGetCount(&n), CUDA_SUCCESS);
  EXPECT_EQ(n, 1);
  CUdevice d = -1;
  EXPECT_EQ(cuDeviceGet(&d, 0), CUDA_SUCCESS);
  EXPECT_EQ(d, 0);
  EXPECT_EQ(cuDeviceGet(&d, 1), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 0), CUDA_SUCCESS);
  EXPECT_EQ(v, 1980000);
  EXPECT_EQ(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 0), CUDA_SUCCESS);
  EXPECT_EQ(v, 1);
  EXPECT_EQ(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, 0),
            CUDA_SUCCESS);
  EXPECT_EQ(v, 1);
  const char* s = nullptr;
  EXPECT_EQ(cuGetErrorName(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, &s), CUDA_SUCCESS);
  EXPECT_STREQ(s, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED");
  EXPECT_EQ(cuGetErrorString(CUDA_ERROR_INVALID_VALUE, &s), CUDA_SUCCESS);
  EXPECT_STREQ(s, "invalid argument");
}

TEST_F(Driver, RegisterArgumentsAndOverlaps) {
  char* p = static_cast<char*>(map_pages(16));
  EXPECT_EQ(cuMemHostRegister_v2(nullptr, kPg, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemHostRegister_v2(p, 0, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemHostRegister_v2(p, kPg, 0x10), CUDA_ERROR_INVALID_VALUE);
  char* a = p + 4 * kPg;  // registration A = [a, a + 4 pages)
  ASSERT_EQ(cuMemHostRegister_v2(a, 4 * kPg, 0), CUDA_SUCCESS);
  const CUresult k712 = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  EXPECT_EQ(cuMemHostRegister_v2(a, 4 * kPg, 0), k712);                 // same range
  EXPECT_EQ(cuMemHostRegister(a, 4 * kPg, 0), k712);                    // v1 behaves the same
  EXPECT_EQ(cuMemHostRegister_v2(a + kPg, kPg, 0), k712);               // inside
  EXPECT_EQ(cuMemHostRegister_v2(a + 3 * kPg, 2 * kPg, 0), k712);       // straddles the end
  EXPECT_EQ(cuMemHostRegister_v2(a - kPg, 2 * kPg, 0), k712);           // straddles the start
  EXPECT_EQ(cuMemHostRegister_v2(a - kPg, 8 * kPg, 0), k712);           // covers it
  EXPECT_EQ(cuMemHostRegister_v2(a + 4 * kPg - 1, 1, 0), k712);         // last byte
  EXPECT_EQ(cuMemHostRegister_v2(a, 4 * kPg, CU_MEMHOSTREGISTER_PORTABLE), k712);  // other flags
  // Adjacent ranges do not overlap.
  ASSERT_EQ(cuMemHostRegister_v2(a + 4 * kPg, kPg, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemHostRegister_v2(a - kPg, kPg, 0), CUDA_SUCCESS);
  // Overlap with a registration of another context is also 712.
  CUcontext other;
  ASSERT_EQ(cuCtxCreate_v2(&other, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuMemHostRegister_v2(a + kPg, 10, 0), k712);
  ASSERT_EQ(cuCtxDestroy_v2(other), CUDA_SUCCESS);
  EXPECT_EQ(cuMemHostUnregister(a + 4 * kPg), CUDA_SUCCESS);
  EXPECT_EQ(cuMemHostUnregister(a - kPg), CUDA_SUCCESS);
  EXPECT_EQ(cuMemHostUnregister(a), CUDA_SUCCESS);
  munmap(p, 16 * kPg);
}

TEST_F(Driver, UnalignedMallocBufferRegisters) {
  void* m = std::malloc(1000);
  ASSERT_EQ(cuMemHostRegister_v2(static_cast<char*>(m) + 1, 999, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuMemHostUnregister(static_cast<char*>(m) + 1), CUDA_SUCCESS);
  std::free(m);
}

TEST_F(Driver, UnregisterCodes) {
  char* p = static_cast<char*>(map_pages(4));
  EXPECT_EQ(cuMemHostUnregister(nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemHostUnregister(p), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  ASSERT_EQ(cuMemHostRegister_v2(p, 2 * kPg, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuMemHostUnregister(p + 8), CUDA_ERROR_INVALID_VALUE);  // interior: 1 (measured)
  EXPECT_EQ(cuMemHostUnregister(p + kPg), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemHostUnregister(p + 2 * kPg), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  EXPECT_EQ(cuMemHostUnregister(p), CUDA_SUCCESS);
  EXPECT_EQ(cuMemHostUnregister(p), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  munmap(p, 4 * kPg);
}

TEST_F(Driver, FlagsAndDevicePointer) {
  char* p = static_cast<char*>(map_pages(4));
  char* q = p + 2 * kPg;
  ASSERT_EQ(cuMemHostRegister_v2(p, kPg, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemHostRegister_v2(q, kPg, 3), CUDA_SUCCESS);
  unsigned f = 0;
  EXPECT_EQ(cuMemHostGetFlags(&f, p), CUDA_SUCCESS);
  EXPECT_EQ(f, 2u);  // DEVICEMAP always reported (measured)
  EXPECT_EQ(cuMemHostGetFlags(&f, q + 100), CUDA_SUCCESS);
  EXPECT_EQ(f, 3u);
  f = 0xdead;
  EXPECT_EQ(cuMemHostGetFlags(&f, p + kPg), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(f, 0xdeadu);  // untouched
  CUdeviceptr d = 1;
  EXPECT_EQ(cuMemHostGetDevicePointer_v2(&d, p, 0), CUDA_SUCCESS);
  EXPECT_EQ(d, reinterpret_cast<CUdeviceptr>(p));
  EXPECT_EQ(cuMemHostGetDevicePointer_v2(&d, p + 10, 0), CUDA_SUCCESS);
  EXPECT_EQ(d, reinterpret_cast<CUdeviceptr>(p + 10));
  d = 1;
  EXPECT_EQ(cuMemHostGetDevicePointer_v2(&d, p + kPg, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(d, 0u);  // measured: dp=(nil)
  EXPECT_EQ(cuMemHostUnregister(p), CUDA_SUCCESS);
  EXPECT_EQ(cuMemHostUnregister(q), CUDA_SUCCESS);
  munmap(p, 4 * kPg);
}

TEST_F(Driver, PointerAttributes) {
  char* p = static_cast<char*>(map_pages(2));
  // Unregistered host memory: Attributes succeeds with type 0, Attribute fails with 1.
  unsigned type = 99;
  int ordinal = 99;
  CUdeviceptr dptr = 1;
  void* hptr = reinterpret_cast<void*>(1);
  CUcontext c = reinterpret_cast<CUcontext>(1);
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                 CU_POINTER_ATTRIBUTE_DEVICE_POINTER, CU_POINTER_ATTRIBUTE_HOST_POINTER,
                                 CU_POINTER_ATTRIBUTE_CONTEXT};
  void* data[] = {&type, &ordinal, &dptr, &hptr, &c};
  EXPECT_EQ(cuPointerGetAttributes(5, attrs, data, reinterpret_cast<CUdeviceptr>(p)), CUDA_SUCCESS);
  EXPECT_EQ(type, 0u);
  EXPECT_EQ(ordinal, -2);
  EXPECT_EQ(dptr, 0u);
  EXPECT_EQ(c, nullptr);
  EXPECT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                  reinterpret_cast<CUdeviceptr>(p)),
            CUDA_ERROR_INVALID_VALUE);
  // Registered host memory.
  ASSERT_EQ(cuMemHostRegister_v2(p, kPg, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuPointerGetAttributes(5, attrs, data, reinterpret_cast<CUdeviceptr>(p + 5)), CUDA_SUCCESS);
  EXPECT_EQ(type, static_cast<unsigned>(CU_MEMORYTYPE_HOST));
  EXPECT_EQ(ordinal, 0);
  EXPECT_EQ(dptr, reinterpret_cast<CUdeviceptr>(p + 5));
  EXPECT_EQ(hptr, p + 5);
  EXPECT_EQ(c, ctx_);
  EXPECT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                  reinterpret_cast<CUdeviceptr>(p)),
            CUDA_SUCCESS);
  EXPECT_EQ(type, static_cast<unsigned>(CU_MEMORYTYPE_HOST));
  EXPECT_EQ(cuMemHostUnregister(p), CUDA_SUCCESS);
  // Device memory.
  CUdeviceptr d;
  ASSERT_EQ(cuMemAlloc_v2(&d, 1000), CUDA_SUCCESS);
  EXPECT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d + 10), CUDA_SUCCESS);
  EXPECT_EQ(type, static_cast<unsigned>(CU_MEMORYTYPE_DEVICE));
  EXPECT_EQ(cuMemFree_v2(d), CUDA_SUCCESS);
  munmap(p, 2 * kPg);
}

TEST_F(Driver, CopiesReallyCopy) {
  std::vector<unsigned char> src(10000), dst(10000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 31 + 7);
  CUdeviceptr d, d2;
  ASSERT_EQ(cuMemAlloc_v2(&d, src.size()), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAlloc_v2(&d2, src.size()), CUDA_SUCCESS);
  ASSERT_EQ(cuMemHostRegister_v2(src.data(), src.size(), 0), CUDA_SUCCESS);
  EXPECT_EQ(cuMemcpyHtoD_v2(d, src.data(), src.size()), CUDA_SUCCESS);
  EXPECT_EQ(cuMemcpy(d2, d, src.size()), CUDA_SUCCESS);
  CUstream s;
  ASSERT_EQ(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  EXPECT_EQ(cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(dst.data()), d2, dst.size(), s), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamSynchronize(s), CUDA_SUCCESS);
  EXPECT_EQ(src, dst);
  std::fill(dst.begin(), dst.end(), 0);
  EXPECT_EQ(cuMemcpyDtoH_v2(dst.data(), d, dst.size()), CUDA_SUCCESS);
  EXPECT_EQ(src, dst);
  // HtoD to a non-device destination is rejected.
  EXPECT_EQ(cuMemcpyHtoD_v2(reinterpret_cast<CUdeviceptr>(dst.data()), src.data(), 10),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuStreamDestroy_v2(s), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuMemHostUnregister(src.data()), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(d), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(d2), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(d2), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(Driver, ContextTeardownDropsRegistrations) {
  char* p = static_cast<char*>(map_pages(2));
  unsigned long before = live_regs();
  CUcontext c;
  ASSERT_EQ(cuCtxCreate_v4(&c, nullptr, 0, 0), CUDA_SUCCESS);  // pushed, current
  ASSERT_EQ(cuMemHostRegister_v2(p, kPg, 0), CUDA_SUCCESS);
  EXPECT_EQ(live_regs(), before + 1);
  ASSERT_EQ(cuCtxDestroy_v2(c), CUDA_SUCCESS);  // pops it; the primary is current again
  EXPECT_EQ(live_regs(), before);
  CUcontext cur = nullptr;
  EXPECT_EQ(cuCtxGetCurrent(&cur), CUDA_SUCCESS);
  EXPECT_EQ(cur, ctx_);
  EXPECT_EQ(cuMemHostUnregister(p), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  EXPECT_EQ(cuMemHostRegister_v2(p, kPg, 0), CUDA_SUCCESS);  // no 712: it was dropped
  EXPECT_EQ(cuMemHostUnregister(p), CUDA_SUCCESS);
  // A destroyed context that is still current elsewhere reports 709.
  ASSERT_EQ(cuCtxCreate_v2(&c, 0, 0), CUDA_SUCCESS);
  std::thread([c] {
    ASSERT_EQ(cuCtxSetCurrent(c), CUDA_SUCCESS);
  }).join();
  ASSERT_EQ(cuCtxPushCurrent_v2(c), CUDA_SUCCESS);
  CUcontext popped;
  ASSERT_EQ(cuCtxPopCurrent_v2(&popped), CUDA_SUCCESS);
  EXPECT_EQ(popped, c);
  ASSERT_EQ(cuCtxPopCurrent_v2(&popped), CUDA_SUCCESS);  // the one cuCtxCreate pushed
  ASSERT_EQ(cuCtxDestroy_v2(c), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxPushCurrent_v2(c), CUDA_SUCCESS);
  EXPECT_EQ(cuMemHostRegister_v2(p, kPg, 0), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  ASSERT_EQ(cuCtxPopCurrent_v2(&popped), CUDA_SUCCESS);
  munmap(p, 2 * kPg);
}

TEST_F(Driver, PrimaryContextRefcountAndReset) {
  char* p = static_cast<char*>(map_pages(1));
  unsigned flags;
  int active = 0;
  EXPECT_EQ(cuDevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
  EXPECT_EQ(active, 1);
  CUcontext c2;
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&c2, 0), CUDA_SUCCESS);
  EXPECT_EQ(c2, ctx_);  // same handle
  ASSERT_EQ(cuMemHostRegister_v2(p, kPg, 0), CUDA_SUCCESS);
  unsigned long before = live_regs();
  ASSERT_EQ(cuDevicePrimaryCtxReset_v2(0), CUDA_SUCCESS);
  EXPECT_EQ(live_regs(), before - 1);
  EXPECT_EQ(cuDevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
  EXPECT_EQ(active, 0);
  EXPECT_EQ(cuMemHostRegister_v2(p, kPg, 0), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  // Retain brings it back (SetUp's retain was consumed by the reset).
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&c2, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuMemHostRegister_v2(p, kPg, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuMemHostUnregister(p), CUDA_SUCCESS);
  // The reset also took away any reference the runtime held: let the runtime
  // forget it too (it re-retains on its next call), then re-balance TearDown.
  ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&c2, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSetCurrent(c2), CUDA_SUCCESS);
  munmap(p, kPg);
}

TEST(DriverProcAddress, GetterWalkAndVersions) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  ASSERT_NE(h, nullptr);
  using Getter = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
  using Getter1 = CUresult (*)(const char*, void**, int, cuuint64_t);
  auto gpa = reinterpret_cast<Getter>(dlsym(h, "cuGetProcAddress_v2"));
  ASSERT_NE(gpa, nullptr);
  void* f = nullptr;
  CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
  // Ask the getter for itself.
  ASSERT_EQ(gpa("cuGetProcAddress", &f, 11030, 0, &st), CUDA_SUCCESS);
  EXPECT_EQ(st, CU_GET_PROC_ADDRESS_SUCCESS);
  EXPECT_EQ(f, dlsym(h, "cuGetProcAddress"));
  auto gpa1 = reinterpret_cast<Getter1>(f);
  ASSERT_EQ(gpa("cuGetProcAddress", &f, 12000, 0, &st), CUDA_SUCCESS);
  EXPECT_EQ(f, dlsym(h, "cuGetProcAddress_v2"));
  auto gpa2 = reinterpret_cast<Getter>(f);
  // And use the returned getters.
  ASSERT_EQ(gpa2("cuMemHostRegister", &f, 6050, 0, &st), CUDA_SUCCESS);
  EXPECT_EQ(f, dlsym(h, "cuMemHostRegister_v2"));
  ASSERT_EQ(gpa1("cuMemHostRegister", &f, 6000, 0), CUDA_SUCCESS);
  EXPECT_EQ(f, dlsym(h, "cuMemHostRegister"));
  struct {
    const char* name;
    int ver;
    const char* want;
  } cases[] = {
      {"cuMemHostUnregister", 4000, "cuMemHostUnregister"},
      {"cuPointerGetAttribute", 4000, "cuPointerGetAttribute"},
      {"cuPointerGetAttributes", 7000, "cuPointerGetAttributes"},
      {"cuCtxDestroy", 4000, "cuCtxDestroy_v2"},
      {"cuCtxDestroy", 3000, "cuCtxDestroy"},
      {"cuMemAlloc", 3020, "cuMemAlloc_v2"},
      {"cuMemFree", 13000, "cuMemFree_v2"},
      {"cuMemcpyHtoD", 3020, "cuMemcpyHtoD_v2"},
      {"cuMemcpyDtoH", 3020, "cuMemcpyDtoH_v2"},
      {"cuMemHostGetDevicePointer", 3020, "cuMemHostGetDevicePointer_v2"},
      {"cuDevicePrimaryCtxRelease", 11000, "cuDevicePrimaryCtxRelease_v2"},
      {"cuDevicePrimaryCtxRelease", 10020, "cuDevicePrimaryCtxRelease"},
      {"cuDevicePrimaryCtxReset", 11000, "cuDevicePrimaryCtxReset_v2"},
      {"cuCtxPushCurrent", 4000, "cuCtxPushCurrent_v2"},
      {"cuCtxPopCurrent", 4000, "cuCtxPopCurrent_v2"},
      {"cuStreamDestroy", 4000, "cuStreamDestroy_v2"},
      {"cuCtxCreate", 13000, "cuCtxCreate_v4"},
      {"cuCtxCreate", 3020, "cuCtxCreate_v2"},
  };
  for (const auto& c : cases) {
    f = nullptr;
    EXPECT_EQ(gpa2(c.name, &f, c.ver, CU_GET_PROC_ADDRESS_DEFAULT, &st), CUDA_SUCCESS) << c.name;
    EXPECT_EQ(f, dlsym(h, c.want)) << c.name << " @" << c.ver;
  }
  // Unknown names, and versioned names (the getter wants base names).
  f = reinterpret_cast<void*>(1);
  EXPECT_EQ(gpa2("cuNoSuchThing", &f, 13000, 0, &st), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(f, nullptr);
  EXPECT_EQ(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  EXPECT_EQ(gpa2("cuMemHostRegister_v2", &f, 13000, 0, &st), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(gpa2("cuGetProcAddress", &f, 11000, 0, &st), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
}

// ------------------------------------------------------------ runtime ----
TEST(Runtime, RegisterCodesAndLastError) {
  std::vector<char> buf(3 * kPg);
  (void)cudaGetLastError();
  ASSERT_EQ(cudaHostRegister(buf.data(), buf.size(), cudaHostRegisterDefault), cudaSuccess);
  EXPECT_EQ(cudaHostRegister(buf.data() + 5, 10, 0), cudaErrorHostMemoryAlreadyRegistered);
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorHostMemoryAlreadyRegistered);
  int n = 0;
  EXPECT_EQ(cudaGetDeviceCount(&n), cudaSuccess);  // success does not clear it
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorHostMemoryAlreadyRegistered);
  EXPECT_EQ(cudaGetLastError(), cudaErrorHostMemoryAlreadyRegistered);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaHostUnregister(buf.data() + 1), cudaErrorInvalidValue);
  EXPECT_EQ(cudaHostUnregister(buf.data()), cudaSuccess);
  EXPECT_EQ(cudaHostUnregister(buf.data()), cudaErrorHostMemoryNotRegistered);
  EXPECT_EQ(cudaHostRegister(buf.data(), buf.size(), 0x20), cudaErrorInvalidValue);
  // The last error is per thread.
  std::thread([] { EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess); }).join();
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_STREQ(cudaGetErrorName(cudaErrorHostMemoryNotRegistered), "cudaErrorHostMemoryNotRegistered");
}

TEST(Runtime, QueriesOnRegisteredAndUnregistered) {
  std::vector<char> buf(2 * kPg);
  char* p = buf.data();
  cudaPointerAttributes a;
  ASSERT_EQ(cudaPointerGetAttributes(&a, p), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeUnregistered);
  EXPECT_EQ(a.device, -2);
  EXPECT_EQ(a.devicePointer, nullptr);
  EXPECT_EQ(a.hostPointer, p);
  unsigned f = 0xdead;
  EXPECT_EQ(cudaHostGetFlags(&f, p), cudaErrorInvalidValue);
  EXPECT_EQ(f, 0xdeadu);
  void* dp = reinterpret_cast<void*>(1);
  EXPECT_EQ(cudaHostGetDevicePointer(&dp, p, 0), cudaErrorInvalidValue);
  EXPECT_EQ(dp, nullptr);
  ASSERT_EQ(cudaHostRegister(p, buf.size(), cudaHostRegisterPortable), cudaSuccess);
  ASSERT_EQ(cudaPointerGetAttributes(&a, p + 3), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeHost);
  EXPECT_EQ(a.device, 0);
  EXPECT_EQ(a.devicePointer, p + 3);
  EXPECT_EQ(a.hostPointer, p + 3);
  EXPECT_EQ(cudaHostGetFlags(&f, p), cudaSuccess);
  EXPECT_EQ(f, 3u);
  EXPECT_EQ(cudaHostGetDevicePointer(&dp, p, 0), cudaSuccess);
  EXPECT_EQ(dp, p);
  EXPECT_EQ(cudaHostUnregister(p), cudaSuccess);
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 4096), cudaSuccess);
  ASSERT_EQ(cudaPointerGetAttributes(&a, d), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeDevice);
  EXPECT_EQ(a.devicePointer, d);
  EXPECT_EQ(a.hostPointer, nullptr);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  (void)cudaGetLastError();
}

TEST(Runtime, CopiesStreamsEvents) {
  const size_t n = 1 << 16;
  std::vector<unsigned char> h(n), back(n);
  for (size_t i = 0; i < n; ++i) h[i] = static_cast<unsigned char>(i ^ (i >> 8));
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, n), cudaSuccess);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t e0, e1;
  ASSERT_EQ(cudaEventCreate(&e0), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&e1), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e0, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(d, h.data(), n, cudaMemcpyHostToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(static_cast<char*>(d) + 10, 0xAB, 5, s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e1, s), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(e1), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(e1), cudaSuccess);
  float ms = -1;
  EXPECT_EQ(cudaEventElapsedTime(&ms, e0, e1), cudaSuccess);
  EXPECT_GE(ms, 0.0f);
  ASSERT_EQ(cudaMemcpy(back.data(), d, n, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int i = 10; i < 15; ++i) h[i] = 0xAB;
  EXPECT_EQ(h, back);
  ASSERT_EQ(cudaMemset(d, 1, n), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(back.data(), d, n, cudaMemcpyDefault), cudaSuccess);
  EXPECT_EQ(back[n - 1], 1);
  EXPECT_EQ(cudaStreamQuery(s), cudaSuccess);
  EXPECT_EQ(cudaStreamWaitEvent(s, e1, 0), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(back.data(), d, n, static_cast<cudaMemcpyKind>(7)),
            cudaErrorInvalidMemcpyDirection);
  EXPECT_EQ(cudaEventDestroy(e0), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(e1), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  (void)cudaGetLastError();
}

TEST(Runtime, HostAllocIsRegisteredMemory) {
  void* p = nullptr;
  ASSERT_EQ(cudaHostAlloc(&p, 10000, cudaHostAllocDefault), cudaSuccess);
  cudaPointerAttributes a;
  ASSERT_EQ(cudaPointerGetAttributes(&a, p), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeHost);
  // Measured on the H200 (testapps/expected/diffseq_h200.txt, steps 141-142):
  // registering or unregistering cudaMallocHost memory is an invalid value.
  EXPECT_EQ(cudaHostRegister(p, 100, 0), cudaErrorInvalidValue);
  EXPECT_EQ(cudaHostUnregister(p), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFreeHost(p), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(&p, 100), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(p), cudaSuccess);
  (void)cudaGetLastError();
}

TEST(Runtime, DeviceResetDropsRegistrationsAndReinitializes) {
  std::vector<char> buf(kPg);
  ASSERT_EQ(cudaHostRegister(buf.data(), buf.size(), 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
  EXPECT_EQ(cudaHostUnregister(buf.data()), cudaErrorHostMemoryNotRegistered);
  // Other threads also pick up the new primary context.
  std::thread([&] {
    EXPECT_EQ(cudaHostRegister(buf.data(), buf.size(), 0), cudaSuccess);
  }).join();
  EXPECT_EQ(cudaHostUnregister(buf.data()), cudaSuccess);
  (void)cudaGetLastError();
}

TEST(Runtime, PropertiesAndVersions) {
  cudaDeviceProp p;
  ASSERT_EQ(cudaGetDeviceProperties(&p, 0), cudaSuccess);
  EXPECT_STREQ(p.name, "simcuda H200");
  EXPECT_EQ(p.major, 9);
  EXPECT_EQ(p.unifiedAddressing, 1);
  int v = 0;
  EXPECT_EQ(cudaDriverGetVersion(&v), cudaSuccess);
  EXPECT_EQ(v, 13000);
  EXPECT_EQ(cudaRuntimeGetVersion(&v), cudaSuccess);
  EXPECT_EQ(v, 13000);
  EXPECT_EQ(cudaDeviceGetAttribute(&v, cudaDevAttrCanUseHostPointerForRegisteredMem, 0), cudaSuccess);
  EXPECT_EQ(v, 1);
  EXPECT_EQ(cudaSetDevice(1), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice);
}

TEST(Runtime, ThroughTheGetterUnderASpy) {
  // The spy (LD_PRELOAD) overrides dlsym and wraps the getter like the shim.
  std::string cmd = std::string("LD_PRELOAD=") + SIMCUDA_SPY_PATH + " " + SIMCUDA_SPY_APP_PATH;
  int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc));
  EXPECT_EQ(WEXITSTATUS(rc), 0);
}

// ------------------------------------------------------------ cost model ----
void kernel_stub() {}

TEST(CostModel, SleepOnOff) {
  EnvGuard guard;
  char* p = static_cast<char*>(map_pages(1));
  p[0] = 1;
  ASSERT_EQ(cudaFree(nullptr), cudaSuccess);
  // Off: ten register/unregister pairs.
  setenv("SIMCUDA_SLEEP", "0", 1);
  reload_env();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 10; ++i) {
    ASSERT_EQ(cudaHostRegister(p, kPg, 0), cudaSuccess);
    ASSERT_EQ(cudaHostUnregister(p), cudaSuccess);
  }
  double off_ms = ms_since(t0);
  // On, scaled x50: one pair costs >= 50 * (75 + 43) us = 5.9 ms.
  setenv("SIMCUDA_SLEEP", "1", 1);
  setenv("SIMCUDA_SLEEP_SCALE", "50", 1);
  reload_env();
  t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(cudaHostRegister(p, kPg, 0), cudaSuccess);
  double reg_ms = ms_since(t0);
  t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(cudaHostUnregister(p), cudaSuccess);
  double unreg_ms = ms_since(t0);
  EXPECT_GE(reg_ms, 50 * 0.075);
  EXPECT_GE(unreg_ms, 50 * 0.043);
  EXPECT_LT(off_ms, reg_ms + unreg_ms);
  // Size term: 4 MiB registers >= 75 + 120 us (scale 1).
  setenv("SIMCUDA_SLEEP_SCALE", "1", 1);
  reload_env();
  std::vector<char> big(4 << 20, 1);
  t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(cudaHostRegister(big.data(), big.size(), 0), cudaSuccess);
  EXPECT_GE(ms_since(t0), 0.195);
  ASSERT_EQ(cudaHostUnregister(big.data()), cudaSuccess);
  munmap(p, kPg);
}

TEST(CostModel, UnregisterWaitsForInFlightWorkRegisterDoesNot) {
  EnvGuard guard;
  setenv("SIMCUDA_SLEEP", "1", 1);
  setenv("SIMCUDA_KERNEL_US", "150000", 1);  // 150 ms kernels
  reload_env();
  std::vector<char> buf(64 * 1024, 1);
  cudaStream_t ks;
  ASSERT_EQ(cudaStreamCreateWithFlags(&ks, cudaStreamNonBlocking), cudaSuccess);
  // Launch on another thread and stream, like the measured scenario.
  std::thread([&] {
    void* args[1] = {nullptr};
    EXPECT_EQ(cudaLaunchKernel(reinterpret_cast<const void*>(&kernel_stub), dim3(1), dim3(32), args,
                               0, ks),
              cudaSuccess);
  }).join();
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(cudaStreamQuery(ks), cudaErrorNotReady);
  ASSERT_EQ(cudaHostRegister(buf.data(), buf.size(), 0), cudaSuccess);
  EXPECT_LT(ms_since(t0), 100.0);  // register does not wait for the kernel
  ASSERT_EQ(cudaHostUnregister(buf.data()), cudaSuccess);
  double total = ms_since(t0);
  EXPECT_GE(total, 140.0);  // unregister waited for the kernel
  EXPECT_EQ(cudaStreamQuery(ks), cudaSuccess);
  // During an unregister that waits, other submitters stall too.
  std::thread([&] {
    void* args[1] = {nullptr};
    EXPECT_EQ(cudaLaunchKernel(reinterpret_cast<const void*>(&kernel_stub), dim3(1), dim3(1), args,
                               0, ks),
              cudaSuccess);
  }).join();
  ASSERT_EQ(cudaHostRegister(buf.data(), buf.size(), 0), cudaSuccess);
  std::atomic<double> copy_ms{0};
  std::thread unreg([&] { EXPECT_EQ(cudaHostUnregister(buf.data()), cudaSuccess); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::thread copier([&] {
    std::vector<char> small(64 * 1024), out(64 * 1024);
    void* d = nullptr;
    ASSERT_EQ(cudaMalloc(&d, small.size()), cudaSuccess);
    auto c0 = std::chrono::steady_clock::now();
    cudaStream_t cs;
    ASSERT_EQ(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(d, small.data(), small.size(), cudaMemcpyHostToDevice, cs), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(cs), cudaSuccess);
    copy_ms = ms_since(c0);
    cudaStreamDestroy(cs);
    cudaFree(d);
  });
  unreg.join();
  copier.join();
  EXPECT_GE(copy_ms.load(), 50.0);  // stalled behind the unregister
  cudaStreamDestroy(ks);
  (void)cudaGetLastError();
}

// Issue 14: what the driver does for work in flight, pageable copies, page
// protection, contexts and stream capture (measured on the H200).
class InFlight : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("SIMCUDA_SLEEP", "1", 1);
    setenv("SIMCUDA_KERNEL_US", "80000", 1);  // 80 ms launches
    reload_env();
    ASSERT_EQ(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dev_, kBytes), cudaSuccess);
    ref_.resize(kBytes);
    for (size_t i = 0; i < kBytes; ++i) ref_[i] = static_cast<char>(i * 7 + 3);
    ASSERT_EQ(cudaMemcpy(dev_, ref_.data(), kBytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  void TearDown() override {
    cudaStreamSynchronize(s_);
    cudaStreamDestroy(s_);
    cudaFree(dev_);
    (void)cudaGetLastError();
  }
  void launch() {
    void* args[1] = {nullptr};
    ASSERT_EQ(cudaLaunchKernel(reinterpret_cast<const void*>(&kernel_stub), dim3(1), dim3(1), args,
                               0, s_),
              cudaSuccess);
  }
  bool holds_ref(const char* p) const { return std::memcmp(p, ref_.data(), kBytes) == 0; }
  static constexpr size_t kBytes = 4 << 20;
  EnvGuard guard_;
  cudaStream_t s_ = nullptr;
  void* dev_ = nullptr;
  std::vector<char> ref_;
};

TEST_F(InFlight, PinnedDeviceToHostLandsWhenTheStreamReachesIt) {
  std::vector<char> b(kBytes, 0x5A);
  ASSERT_EQ(cudaHostRegister(b.data(), kBytes, 0), cudaSuccess);
  launch();
  ASSERT_EQ(cudaMemcpyAsync(b.data(), dev_, kBytes, cudaMemcpyDeviceToHost, s_), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(s_), cudaErrorNotReady);
  EXPECT_EQ(b[0], 0x5A);  // behind the launch: not copied yet
  EXPECT_EQ(b[kBytes - 1], 0x5A);
  ASSERT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
  EXPECT_TRUE(holds_ref(b.data()));
  ASSERT_EQ(cudaHostUnregister(b.data()), cudaSuccess);
}

TEST_F(InFlight, UnregisterOfAnotherBufferWaitsForTheCopy) {
  for (int how = 0; how < 3; ++how) {
    SCOPED_TRACE(how);
    std::vector<char> b(kBytes, 0x5A);
    ASSERT_EQ(cudaHostRegister(b.data(), kBytes, 0), cudaSuccess);
    std::vector<char> a(1 << 20, 1);
    void* ha = nullptr;
    if (how < 2)
      ASSERT_EQ(cudaHostRegister(a.data(), a.size(), 0), cudaSuccess);
    else
      ASSERT_EQ(cudaHostAlloc(&ha, 1 << 20, 0), cudaSuccess);
    launch();
    ASSERT_EQ(cudaMemcpyAsync(b.data(), dev_, kBytes, cudaMemcpyDeviceToHost, s_), cudaSuccess);
    if (how == 0) EXPECT_EQ(cudaHostUnregister(a.data()), cudaSuccess);
    if (how == 1) EXPECT_EQ(cuMemHostUnregister(a.data()), CUDA_SUCCESS);
    if (how == 2) EXPECT_EQ(cudaFreeHost(ha), cudaSuccess);
    EXPECT_EQ(cudaStreamQuery(s_), cudaSuccess);
    EXPECT_TRUE(holds_ref(b.data()));  // the unregister waited for all work in flight
    ASSERT_EQ(cudaHostUnregister(b.data()), cudaSuccess);
  }
}

TEST_F(InFlight, PinnedHostToDeviceReadsTheHostBytesWhenItRuns) {
  std::vector<char> h(ref_.begin(), ref_.end()), back(kBytes);
  ASSERT_EQ(cudaHostRegister(h.data(), kBytes, 0), cudaSuccess);
  launch();
  ASSERT_EQ(cudaMemcpyAsync(dev_, h.data(), kBytes, cudaMemcpyHostToDevice, s_), cudaSuccess);
  std::memset(h.data(), 0xAB, kBytes);
  ASSERT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(back.data(), dev_, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, h);  // the later bytes
  ASSERT_EQ(cudaHostUnregister(h.data()), cudaSuccess);
}

TEST_F(InFlight, PageableCopiesBehaveSynchronously) {
  std::vector<char> h(ref_.begin(), ref_.end()), back(kBytes);
  // Registered and unregistered: pageable again.
  ASSERT_EQ(cudaHostRegister(h.data(), kBytes, 0), cudaSuccess);
  ASSERT_EQ(cudaHostUnregister(h.data()), cudaSuccess);
  launch();
  ASSERT_EQ(cudaMemcpyAsync(dev_, h.data(), kBytes, cudaMemcpyHostToDevice, s_), cudaSuccess);
  std::memset(h.data(), 0xAB, kBytes);
  ASSERT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(back.data(), dev_, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_TRUE(holds_ref(back.data()));  // staged: the bytes as of the call
  std::memset(h.data(), 0x11, kBytes);
  launch();
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(cuMemcpyDtoHAsync(h.data(), reinterpret_cast<CUdeviceptr>(dev_), kBytes,
                              reinterpret_cast<CUstream>(s_)),
            CUDA_SUCCESS);
  EXPECT_GE(ms_since(t0), 60.0);  // waited behind the launch
  EXPECT_TRUE(holds_ref(h.data()));  // complete on return
}

TEST_F(InFlight, TwoAndThreeDimensionalCopies) {
  // 64 rows of 1000 bytes, pitch 4096 on the device, 1000 on the host.
  const size_t w = 1000, rows = 64, dpitch = 4096;
  std::vector<char> h(w * rows), back(w * rows, 0);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<char>(i % 251);
  ASSERT_EQ(cudaMemcpy2DAsync(dev_, dpitch, h.data(), w, w, rows, cudaMemcpyHostToDevice, s_),
            cudaSuccess);
  CUDA_MEMCPY2D c;
  std::memset(&c, 0, sizeof c);
  c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  c.srcDevice = reinterpret_cast<CUdeviceptr>(dev_);
  c.srcPitch = dpitch;
  c.dstMemoryType = CU_MEMORYTYPE_HOST;
  c.dstHost = back.data();
  c.dstPitch = w;
  c.WidthInBytes = w;
  c.Height = rows;
  ASSERT_EQ(cuMemcpy2DAsync_v2(&c, reinterpret_cast<CUstream>(s_)), CUDA_SUCCESS);
  ASSERT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
  EXPECT_EQ(back, h);
  EXPECT_EQ(static_cast<unsigned char*>(dev_)[1 * dpitch + 5], static_cast<unsigned char>(h[w + 5]));
  // 3D: 4 slices of 16 rows, the same bytes back through the device.
  std::vector<char> back3(w * rows, 0);
  cudaMemcpy3DParms p;
  std::memset(&p, 0, sizeof p);
  p.srcPtr = pitched(h.data(), w, w, 16);
  p.dstPtr = pitched(dev_, dpitch, w, 16);
  p.extent.width = w, p.extent.height = 16, p.extent.depth = 4;
  p.kind = cudaMemcpyHostToDevice;
  ASSERT_EQ(cudaMemcpy3DAsync(&p, s_), cudaSuccess);
  p.srcPtr = p.dstPtr;
  p.dstPtr = pitched(back3.data(), w, w, 16);
  p.kind = cudaMemcpyDeviceToHost;
  ASSERT_EQ(cudaMemcpy3D(&p), cudaSuccess);
  EXPECT_EQ(back3, h);
  EXPECT_EQ(cudaMemcpy2D(dev_, 10, h.data(), w, w, 2, cudaMemcpyHostToDevice),
            cudaErrorInvalidPitchValue);
  (void)cudaGetLastError();
}

TEST_F(Driver, RegisterChecksThePageProtection) {
  const size_t n = 4 * kPg;
  char* p = static_cast<char*>(map_pages(4));
  std::memset(p, 1, n);
  ASSERT_EQ(mprotect(p, n, PROT_READ), 0);
  EXPECT_EQ(cuMemHostRegister_v2(p, n, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemHostRegister_v2(p, n, CU_MEMHOSTREGISTER_READ_ONLY), CUDA_SUCCESS);
  EXPECT_EQ(cuMemHostUnregister(p), CUDA_SUCCESS);
  ASSERT_EQ(mprotect(p, n, PROT_NONE), 0);
  EXPECT_EQ(cuMemHostRegister_v2(p, n, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemHostRegister_v2(p, n, CU_MEMHOSTREGISTER_READ_ONLY), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(mprotect(p, n, PROT_READ | PROT_WRITE), 0);
  EXPECT_EQ(cuMemHostRegister_v2(p, n, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuMemHostUnregister(p), CUDA_SUCCESS);
  munmap(p, n);
  EXPECT_EQ(cuMemHostRegister_v2(p, n, 0), CUDA_ERROR_INVALID_VALUE);  // unmapped
  EXPECT_EQ(live_regs(), 0u);
}

TEST(Runtime, NewThreadUnregisterMakesThePrimaryContextCurrent) {
  std::vector<char> a(1 << 20, 1);
  ASSERT_EQ(cudaHostRegister(a.data(), a.size(), 0), cudaSuccess);
  std::thread([&] {
    CUcontext c = reinterpret_cast<CUcontext>(1);
    ASSERT_EQ(cuCtxGetCurrent(&c), CUDA_SUCCESS);
    EXPECT_EQ(c, nullptr);
    EXPECT_EQ(cuMemHostUnregister(a.data()), CUDA_ERROR_INVALID_CONTEXT);  // driver: no context
    EXPECT_EQ(cudaHostUnregister(a.data()), cudaSuccess);  // cudart makes one current first
    ASSERT_EQ(cuCtxGetCurrent(&c), CUDA_SUCCESS);
    EXPECT_NE(c, nullptr);
    CUdevice d = -1;
    EXPECT_EQ(cuCtxGetDevice(&d), CUDA_SUCCESS);
  }).join();
}

class Capture : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaHostRegister(a_.data(), a_.size(), 0), cudaSuccess);
    ASSERT_EQ(cuCtxGetCurrent(&ctx_), CUDA_SUCCESS);
  }
  void TearDown() override {
    cudaHostUnregister(a_.data());
    cudaStreamDestroy(s_);
    (void)cudaGetLastError();
  }
  // Begins a global-mode capture on s_, runs f on another thread, ends the capture.
  template <typename F>
  cudaError_t around(F f) {
    EXPECT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaSuccess);
    std::thread(f).join();
    cudaGraph_t g = nullptr;
    cudaError_t e = cudaStreamEndCapture(s_, &g);
    EXPECT_EQ(g != nullptr, e == cudaSuccess);
    if (g) cudaGraphDestroy(g);
    return e;
  }
  cudaStream_t s_ = nullptr;
  CUcontext ctx_ = nullptr;
  std::vector<char> a_ = std::vector<char>(1 << 20, 1);
};

TEST_F(Capture, GlobalModeUnregisterIsRefusedAndInvalidates) {
  EXPECT_EQ(around([&] { EXPECT_EQ(cudaHostUnregister(a_.data()), cudaErrorStreamCaptureUnsupported); }),
            cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(around([&] {
              cuCtxSetCurrent(ctx_);
              EXPECT_EQ(cuMemHostUnregister(a_.data()), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
            }),
            cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(live_regs(), 1u);  // refused: still registered
}

TEST_F(Capture, RelaxedModeUnregisterSucceedsAndTheCaptureSurvives) {
  EXPECT_EQ(around([&] {
              cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
              EXPECT_EQ(cudaThreadExchangeStreamCaptureMode(&m), cudaSuccess);
              EXPECT_EQ(m, cudaStreamCaptureModeGlobal);
              EXPECT_EQ(cudaHostUnregister(a_.data()), cudaSuccess);
            }),
            cudaSuccess);
  EXPECT_EQ(cudaHostRegister(a_.data(), a_.size(), 0), cudaSuccess);
}

TEST_F(Capture, SynchronizeInvalidatesEvenInRelaxedMode) {
  EXPECT_EQ(around([&] {
              cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
              cudaThreadExchangeStreamCaptureMode(&m);
              EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported);
            }),
            cudaErrorStreamCaptureInvalidated);
}

TEST_F(Capture, TheGraphReplaysTheCapturedCopies) {
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, a_.size()), cudaSuccess);
  std::vector<char> back(a_.size(), 0);
  ASSERT_EQ(cudaHostRegister(back.data(), back.size(), 0), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaSuccess);
  cudaStreamCaptureStatus st;
  ASSERT_EQ(cudaStreamIsCapturing(s_, &st), cudaSuccess);
  EXPECT_EQ(st, cudaStreamCaptureStatusActive);
  ASSERT_EQ(cudaMemcpyAsync(d, a_.data(), a_.size(), cudaMemcpyHostToDevice, s_), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(back.data(), d, a_.size(), cudaMemcpyDeviceToHost, s_), cudaSuccess);
  cudaGraph_t g = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s_, &g), cudaSuccess);
  EXPECT_EQ(back[0], 0);  // captured, not run
  cudaGraphExec_t x = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&x, g, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(x, s_), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
  EXPECT_EQ(back, a_);
  cudaGraphExecDestroy(x);
  cudaGraphDestroy(g);
  cudaHostUnregister(back.data());
  cudaFree(d);
}

// ------------------------------------------------------------ stale detection ----
TEST_F(Stale, NoFalsePositivesOnFreshOrRewrittenMemory) {
  unsigned long s0 = stale_count(), c0 = checked_pages();
  // Fresh anonymous memory never touched before registration (zero page
  // trap): the register faults pages in for write, so later writes keep frames.
  char* p = static_cast<char*>(map_pages(8));
  ASSERT_EQ(cuMemHostRegister_v2(p, 8 * kPg, 0), CUDA_SUCCESS);
  std::memset(p, 0x5A, 8 * kPg);
  CUdeviceptr d;
  ASSERT_EQ(cuMemAlloc_v2(&d, 8 * kPg), CUDA_SUCCESS);
  for (int i = 0; i < 10; ++i) {
    ASSERT_EQ(cuMemcpyHtoD_v2(d, p, 8 * kPg), CUDA_SUCCESS);
    ASSERT_EQ(cuMemcpyDtoH_v2(p, d, 8 * kPg), CUDA_SUCCESS);
  }
  EXPECT_EQ(checked_pages() - c0, 20u * 8);
  // A sub-range copy checks only its pages (unaligned range over 2 pages).
  c0 = checked_pages();
  ASSERT_EQ(cuMemcpyHtoD_v2(d, p + kPg + 100, kPg), CUDA_SUCCESS);
  EXPECT_EQ(checked_pages() - c0, 2u);
  // A read-only registration of never-written memory.
  char* r = static_cast<char*>(map_pages(2));
  ASSERT_EQ(cuMemHostRegister_v2(r, 2 * kPg, CU_MEMHOSTREGISTER_READ_ONLY), CUDA_SUCCESS);
  r[0] = 1;
  ASSERT_EQ(cuMemcpyHtoD_v2(d, r, 2 * kPg), CUDA_SUCCESS);
  EXPECT_EQ(stale_count(), s0);
  EXPECT_EQ(cuMemHostUnregister(r), CUDA_SUCCESS);
  EXPECT_EQ(cuMemHostUnregister(p), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(d), CUDA_SUCCESS);
  munmap(p, 8 * kPg);
  munmap(r, 2 * kPg);
}

TEST_F(Stale, MunmapThenMmapFixedAtSameAddressAborts) {
  char* p = static_cast<char*>(map_pages(4));
  std::memset(p, 1, 4 * kPg);
  ASSERT_EQ(cuMemHostRegister_v2(p, 4 * kPg, 0), CUDA_SUCCESS);
  CUdeviceptr d;
  ASSERT_EQ(cuMemAlloc_v2(&d, 4 * kPg), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyHtoD_v2(d, p, 4 * kPg), CUDA_SUCCESS);  // fine before
  ASSERT_EQ(munmap(p, 4 * kPg), 0);
  void* q = mmap(p, 4 * kPg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  ASSERT_EQ(q, p);
  std::memset(p, 2, 4 * kPg);
  EXPECT_DEATH(cuMemcpyHtoD_v2(d, p, 4 * kPg), "simcuda: STALE REGISTRATION");
  EXPECT_DEATH(cuMemcpyDtoH_v2(p + 2 * kPg, d, 10), "simcuda: STALE REGISTRATION");
  EXPECT_DEATH(cuMemcpyAsync(d, reinterpret_cast<CUdeviceptr>(p + 3 * kPg), 1, nullptr),
               "simcuda: STALE REGISTRATION");
  EXPECT_EQ(cuMemHostUnregister(p), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(d), CUDA_SUCCESS);
  munmap(p, 4 * kPg);
}

TEST_F(Stale, CountModeCountsAndContinues) {
  EnvGuard guard;
  setenv("SIMCUDA_STALE", "count", 1);
  reload_env();
  unsigned long s0 = stale_count();
  char* p = static_cast<char*>(map_pages(4));
  std::memset(p, 1, 4 * kPg);
  ASSERT_EQ(cuMemHostRegister_v2(p, 4 * kPg, 0), CUDA_SUCCESS);
  CUdeviceptr d;
  ASSERT_EQ(cuMemAlloc_v2(&d, 4 * kPg), CUDA_SUCCESS);
  // mmap(MAP_FIXED) over the registration, no munmap first.
  ASSERT_EQ(mmap(p + kPg, kPg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0),
            p + kPg);
  p[kPg] = 3;
  ASSERT_EQ(cuMemcpyHtoD_v2(d, p, kPg), CUDA_SUCCESS);  // page 0 is fine
  EXPECT_EQ(stale_count(), s0);
  ASSERT_EQ(cuMemcpyHtoD_v2(d, p, 4 * kPg), CUDA_SUCCESS);  // page 1 is stale
  EXPECT_EQ(stale_count(), s0 + 1);
  // madvise(DONTNEED) drops the frames of page 3.
  ASSERT_EQ(madvise(p + 3 * kPg, kPg, MADV_DONTNEED), 0);
  ASSERT_EQ(cuMemcpyHtoD_v2(d, p + 3 * kPg, 8), CUDA_SUCCESS);
  EXPECT_EQ(stale_count(), s0 + 2);
  // Re-registering after unregister takes a new snapshot: no more reports.
  ASSERT_EQ(cuMemHostUnregister(p), CUDA_SUCCESS);
  ASSERT_EQ(cuMemHostRegister_v2(p, 4 * kPg, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyHtoD_v2(d, p, 4 * kPg), CUDA_SUCCESS);
  EXPECT_EQ(stale_count(), s0 + 2);
  // The runtime path reports too.
  ASSERT_EQ(madvise(p, kPg, MADV_DONTNEED), 0);
  ASSERT_EQ(cudaMemcpy(reinterpret_cast<void*>(d), p, 16, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(stale_count(), s0 + 3);
  EXPECT_EQ(cuMemHostUnregister(p), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(d), CUDA_SUCCESS);
  munmap(p, 4 * kPg);
}

TEST_F(Stale, ForkIsNotAFalsePositive) {
  char* p = static_cast<char*>(map_pages(4));
  std::memset(p, 1, 4 * kPg);
  ASSERT_EQ(cuMemHostRegister_v2(p, 4 * kPg, 0), CUDA_SUCCESS);
  CUdeviceptr d;
  ASSERT_EQ(cuMemAlloc_v2(&d, 4 * kPg), CUDA_SUCCESS);
  pid_t pid = fork();
  if (pid == 0) {
    std::memset(p, 2, 4 * kPg);  // COW in the child
    _exit(cuMemcpyHtoD_v2(d, p, 4 * kPg) == CUDA_SUCCESS ? 0 : 1);
  }
  ASSERT_GT(pid, 0);
  std::memset(p, 3, 4 * kPg);  // and in the parent
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "child status " << st;
  ASSERT_EQ(cuMemcpyHtoD_v2(d, p, 4 * kPg), CUDA_SUCCESS);  // would abort if stale
  EXPECT_EQ(cuMemHostUnregister(p), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(d), CUDA_SUCCESS);
  munmap(p, 4 * kPg);
}

TEST_F(Stale, ConcurrentCopiesAndRegistrations) {
  const int kThreads = 4;
  std::vector<std::thread> ts;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      if (cuCtxSetCurrent(ctx_) != CUDA_SUCCESS) failures++;
      std::vector<char> buf(8 * kPg, static_cast<char>(t));
      CUdeviceptr d;
      if (cuMemAlloc_v2(&d, buf.size()) != CUDA_SUCCESS) failures++;
      for (int i = 0; i < 200; ++i) {
        if (cuMemHostRegister_v2(buf.data(), buf.size(), 0) != CUDA_SUCCESS) failures++;
        if (cuMemcpyHtoD_v2(d, buf.data(), buf.size()) != CUDA_SUCCESS) failures++;
        if (cuMemcpyDtoH_v2(buf.data(), d, buf.size()) != CUDA_SUCCESS) failures++;
        if (cuMemHostUnregister(buf.data()) != CUDA_SUCCESS) failures++;
      }
      cuMemFree_v2(d);
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace

int main(int argc, char** argv) {
  setenv("SIMCUDA_SLEEP", "0", 0);  // fast unless the caller asks otherwise
  ::testing::InitGoogleTest(&argc, argv);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  return RUN_ALL_TESTS();
}

// ------------------------------------------------------- several devices ----
// Run with SIMCUDA_DEVICES=4 (ctest simcuda_multi_test); skipped with one device.
class MultiDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
    if (n < 2) GTEST_SKIP() << "one device (set SIMCUDA_DEVICES)";
    devices_ = n;
  }
  void TearDown() override {
    cudaSetDevice(0);
    (void)cudaGetLastError();
  }
  void launch_on(cudaStream_t s) {
    void* args[1] = {nullptr};
    ASSERT_EQ(cudaLaunchKernel(reinterpret_cast<const void*>(&kernel_stub), dim3(1), dim3(1), args,
                               0, s),
              cudaSuccess);
  }
  int devices_ = 0;
};

TEST_F(MultiDevice, DevicesContextsAndOrdinals) {
  EXPECT_EQ(devices_, 4) << "SIMCUDA_DEVICES=4";
  CUdevice d = -1;
  EXPECT_EQ(cuDeviceGet(&d, devices_), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(cudaSetDevice(devices_), cudaErrorInvalidDevice);
  (void)cudaGetLastError();
  std::vector<CUcontext> primaries;
  for (int dev = 0; dev < devices_; ++dev) {
    ASSERT_EQ(cudaSetDevice(dev), cudaSuccess);
    int got = -1;
    ASSERT_EQ(cudaGetDevice(&got), cudaSuccess);
    EXPECT_EQ(got, dev);
    CUcontext c = nullptr;
    ASSERT_EQ(cuCtxGetCurrent(&c), CUDA_SUCCESS);
    ASSERT_EQ(cuCtxGetDevice(&d), CUDA_SUCCESS);
    EXPECT_EQ(d, dev);
    for (CUcontext other : primaries) EXPECT_NE(c, other);
    primaries.push_back(c);
    // Pointer attributes name the device of the context that made the memory.
    std::vector<char> buf(kPg);
    ASSERT_EQ(cudaHostRegister(buf.data(), buf.size(), 0), cudaSuccess);
    void* dev_mem = nullptr;
    ASSERT_EQ(cudaMalloc(&dev_mem, kPg), cudaSuccess);
    ASSERT_EQ(cudaSetDevice((dev + 1) % devices_), cudaSuccess);
    cudaPointerAttributes a;
    ASSERT_EQ(cudaPointerGetAttributes(&a, buf.data()), cudaSuccess);
    EXPECT_EQ(a.device, dev);
    ASSERT_EQ(cudaPointerGetAttributes(&a, dev_mem), cudaSuccess);
    EXPECT_EQ(a.device, dev);
    EXPECT_EQ(cudaHostUnregister(buf.data()), cudaSuccess) << "any context may unregister";
    EXPECT_EQ(cudaFree(dev_mem), cudaSuccess);
  }
}

TEST_F(MultiDevice, RegistrationsOverlapAcrossDevicesAndKeepTheirFlags) {
  std::vector<char> buf(4 * kPg);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaHostRegister(buf.data(), buf.size(), 0), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  EXPECT_EQ(cudaHostRegister(buf.data() + kPg, kPg, cudaHostRegisterPortable),
            cudaErrorHostMemoryAlreadyRegistered);
  unsigned flags = 0;
  ASSERT_EQ(cudaHostGetFlags(&flags, buf.data()), cudaSuccess);
  EXPECT_EQ(flags, 2u);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaHostUnregister(buf.data()), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaHostRegister(buf.data(), buf.size(), cudaHostRegisterPortable), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(2), cudaSuccess);
  ASSERT_EQ(cudaHostGetFlags(&flags, buf.data()), cudaSuccess);
  EXPECT_EQ(flags, 3u);
  EXPECT_EQ(cudaHostUnregister(buf.data()), cudaSuccess);
  (void)cudaGetLastError();
}

TEST_F(MultiDevice, SynchronizeWaitsForItsDeviceAndUnregisterForEvery) {
  EnvGuard guard;
  setenv("SIMCUDA_SLEEP", "1", 1);
  setenv("SIMCUDA_KERNEL_US", "150000", 1);
  reload_env();
  cudaStream_t s1;
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
  launch_on(s1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  std::vector<char> buf(kPg);
  ASSERT_EQ(cudaHostRegister(buf.data(), buf.size(), 0), cudaSuccess);
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_LT(ms_since(t0), 100.0) << "device 0 has nothing in flight";
  EXPECT_EQ(cudaStreamQuery(s1), cudaErrorNotReady);
  ASSERT_EQ(cudaHostUnregister(buf.data()), cudaSuccess);
  EXPECT_GE(ms_since(t0), 140.0) << "the unregister waits for every device";
  EXPECT_EQ(cudaStreamQuery(s1), cudaSuccess);
}

TEST_F(MultiDevice, OnlyPortableRegistrationsArePinnedForAnotherDevice) {
  EnvGuard guard;
  setenv("SIMCUDA_SLEEP", "1", 1);
  setenv("SIMCUDA_KERNEL_US", "50000", 1);
  reload_env();
  for (unsigned flags : {0u, unsigned{cudaHostRegisterPortable}}) {
    const size_t n = 64 * 1024;
    std::vector<unsigned char> h(n, 1), back(n, 0);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaHostRegister(h.data(), n, flags), cudaSuccess);
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    void* d = nullptr;
    ASSERT_EQ(cudaMalloc(&d, n), cudaSuccess);
    launch_on(s);
    ASSERT_EQ(cudaMemcpyAsync(d, h.data(), n, cudaMemcpyHostToDevice, s), cudaSuccess);
    std::memset(h.data(), 2, n);  // after the call, before the copy runs
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(back.data(), d, n, cudaMemcpyDeviceToHost), cudaSuccess);
    // Not PORTABLE: pageable for device 1 (staged at the call); PORTABLE:
    // pinned for it, read when the stream reaches the copy.
    EXPECT_EQ(back[0], flags ? 2 : 1) << "flags " << flags;
    ASSERT_EQ(cudaFree(d), cudaSuccess);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaHostUnregister(h.data()), cudaSuccess);
  }
}

TEST_F(MultiDevice, DeviceResetIsPerDevice) {
  std::vector<char> a(kPg), b(kPg);
  const unsigned long before = live_regs();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaHostRegister(a.data(), a.size(), 0), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaHostRegister(b.data(), b.size(), 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
  EXPECT_EQ(live_regs(), before + 1);
  EXPECT_EQ(cudaHostUnregister(b.data()), cudaErrorHostMemoryNotRegistered);
  (void)cudaGetLastError();
  unsigned flags = 0;
  int active = 0;
  ASSERT_EQ(cuDevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
  EXPECT_EQ(active, 1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaHostUnregister(a.data()), cudaSuccess);
}

TEST_F(MultiDevice, PeerAccessAndCopies) {
  int can = -1;
  ASSERT_EQ(cudaDeviceCanAccessPeer(&can, 0, 1), cudaSuccess);
  EXPECT_EQ(can, 1);
  ASSERT_EQ(cudaDeviceCanAccessPeer(&can, 1, 1), cudaSuccess);
  EXPECT_EQ(can, 0);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaDeviceEnablePeerAccess(0, 0), cudaErrorPeerAccessUnsupported);
  EXPECT_EQ(cudaDeviceEnablePeerAccess(1, 1), cudaErrorInvalidValue);
  EXPECT_EQ(cudaDeviceEnablePeerAccess(1, 0), cudaSuccess);
  EXPECT_EQ(cudaDeviceEnablePeerAccess(1, 0), cudaErrorPeerAccessAlreadyEnabled);
  EXPECT_EQ(cudaDeviceDisablePeerAccess(1), cudaSuccess);
  EXPECT_EQ(cudaDeviceDisablePeerAccess(1), cudaErrorPeerAccessNotEnabled);
  (void)cudaGetLastError();
  const size_t n = 8192;
  std::vector<unsigned char> h(n, 7), back(n, 0);
  void *d0 = nullptr, *d1 = nullptr;
  ASSERT_EQ(cudaMalloc(&d0, n), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d0, h.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d1, n), cudaSuccess);
  ASSERT_EQ(cudaMemcpyPeer(d1, 1, d0, 0, n), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(back.data(), d1, n, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, h);
  EXPECT_EQ(cudaMemcpyPeer(d1, 0, d0, 0, n), cudaErrorInvalidValue) << "d1 is device 1's";
  (void)cudaGetLastError();
  EXPECT_EQ(cudaFree(d1), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaFree(d0), cudaSuccess);
}
