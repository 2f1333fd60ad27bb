// hostalloc.cu: pinned host allocations and their frees, through each door
// lazypin hooks: cudaHostAlloc / cudaMallocHost / cudaFreeHost (runtime),
// cuMemHostAlloc / cuMemAllocHost / cuMemFreeHost (linked driver),
// the same from cuGetProcAddress (getproc) and from dlsym on libcuda (dlsym).
//
// CLI: hostalloc [--path runtime|driver|getproc|dlsym|all] [--check] [--bench]
//                [--sizes 4M,64M] [--cycles N] [--fork] [--idle-wait-ms N]
//   --check   correctness lines "CHECK <path> <name> <values>": codes, flags,
//             bytes, pointer queries after a free, a double free, a served
//             block reading as zeros, the implicit wait of a free. No pointer
//             or time in them: bare and lazypin runs must print the same.
//   --bench   per size: "RESULT app=hostalloc path=<p> size=<b> op=cycle ..."
//             (allocate, fill, copy to the device, free: median per cycle)
//             and op=kept (fill and copy from memory kept pinned).
//   --fork    a block freed before fork(), then the parent allocates again
//             ("CHECK <path> fork ..."); with --fork-child-cuda the child
//             allocates the same size, checks zeros and frees it (the
//             simulator allows CUDA in a fork's child; a real driver refuses it).
//   --idle-wait-ms N  at the end: free a block, sleep N ms (idle release).
//   --munmap-after-free  a use after free the simulator allows: munmap a block
//             just freed (an unmapped range then), allocate again, check zeros
//             (not in --check: the real driver's freed ranges are its own).
// Exits 0 when every check printed OK (FAIL lines: exit 1).
#include <cuda.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include "common.h"

namespace {

using AllocFn = int (*)(void**, size_t, unsigned);
using MallocFn = int (*)(void**, size_t);
using FreeFn = int (*)(void*);
using FlagsFn = int (*)(unsigned*, void*);
using DevPtrFn = int (*)(void**, void*);

struct Door {
  const char* name;
  AllocFn alloc;      // with flags
  MallocFn malloc;    // without
  FreeFn free;
  FlagsFn flags;
  DevPtrFn devptr;
};

// ---- runtime
int RtAlloc(void** p, size_t n, unsigned f) { return cudaHostAlloc(p, n, f); }
int RtMalloc(void** p, size_t n) { return cudaMallocHost(p, n); }
int RtFree(void* p) { return cudaFreeHost(p); }
int RtFlags(unsigned* f, void* p) { return cudaHostGetFlags(f, p); }
int RtDevPtr(void** d, void* p) { return cudaHostGetDevicePointer(d, p, 0); }

// ---- driver, through function pointers from the linked library, the getter or dlsym
CUresult (*g_cu_alloc)(void**, size_t, unsigned);
CUresult (*g_cu_malloc)(void**, size_t);
CUresult (*g_cu_free)(void*);
CUresult (*g_cu_flags)(unsigned*, void*);
CUresult (*g_cu_devptr)(CUdeviceptr*, void*, unsigned);
int CuAlloc(void** p, size_t n, unsigned f) { return g_cu_alloc(p, n, f); }
int CuMalloc(void** p, size_t n) { return g_cu_malloc(p, n); }
int CuFree(void* p) { return g_cu_free(p); }
int CuFlags(unsigned* f, void* p) { return g_cu_flags(f, p); }
int CuDevPtr(void** d, void* p) {
  CUdeviceptr dp = 0;
  const int rc = g_cu_devptr(&dp, p, 0);
  *d = reinterpret_cast<void*>(dp);
  return rc;
}

bool SetDriverDoor(const std::string& path) {
  if (path == "driver") {
    g_cu_alloc = &cuMemHostAlloc;
    g_cu_malloc = &cuMemAllocHost;
    g_cu_free = &cuMemFreeHost;
    g_cu_flags = &cuMemHostGetFlags;
    g_cu_devptr = &cuMemHostGetDevicePointer;
    return true;
  }
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) return false;
  if (path == "dlsym") {
    g_cu_alloc = reinterpret_cast<decltype(g_cu_alloc)>(dlsym(h, "cuMemHostAlloc"));
    g_cu_malloc = reinterpret_cast<decltype(g_cu_malloc)>(dlsym(h, "cuMemAllocHost_v2"));
    g_cu_free = reinterpret_cast<decltype(g_cu_free)>(dlsym(h, "cuMemFreeHost"));
    g_cu_flags = reinterpret_cast<decltype(g_cu_flags)>(dlsym(h, "cuMemHostGetFlags"));
    g_cu_devptr = reinterpret_cast<decltype(g_cu_devptr)>(dlsym(h, "cuMemHostGetDevicePointer_v2"));
  } else {
    using GetProc = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
    auto get = reinterpret_cast<GetProc>(dlsym(h, "cuGetProcAddress_v2"));
    if (get == nullptr) return false;
    auto one = [&](const char* name, void** out) {
      CUdriverProcAddressQueryResult status;
      return get(name, out, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status) == CUDA_SUCCESS;
    };
    bool ok = one("cuMemHostAlloc", reinterpret_cast<void**>(&g_cu_alloc)) &&
              one("cuMemAllocHost", reinterpret_cast<void**>(&g_cu_malloc)) &&
              one("cuMemFreeHost", reinterpret_cast<void**>(&g_cu_free)) &&
              one("cuMemHostGetFlags", reinterpret_cast<void**>(&g_cu_flags)) &&
              one("cuMemHostGetDevicePointer", reinterpret_cast<void**>(&g_cu_devptr));
    if (!ok) return false;
  }
  return g_cu_alloc && g_cu_malloc && g_cu_free && g_cu_flags && g_cu_devptr;
}

int g_failures = 0;

void Check(const std::string& path, const char* name, bool ok, const std::string& values) {
  std::printf("CHECK %s %s %s %s\n", path.c_str(), name, values.c_str(), ok ? "OK" : "FAIL");
  if (!ok) g_failures += 1;
}
std::string Codes(std::initializer_list<long long> v) {
  std::string out;
  for (long long x : v) out += (out.empty() ? "" : " ") + std::to_string(x);
  return out;
}
bool AllZero(const void* p, size_t n) {
  const unsigned char* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) {
    if (b[i] != 0) return false;
  }
  return true;
}

void RunChecks(const Door& d) {
  const std::string path = d.name;
  const size_t n = 1 << 20;
  // 1. A block carries bytes to the device and back.
  void* p = nullptr;
  int rc = d.alloc(&p, n, cudaHostAllocDefault);
  Check(path, "alloc", rc == 0 && p != nullptr, Codes({rc}));
  if (rc != 0) return;
  Check(path, "fresh_zero", AllZero(p, n), "");
  tapp::fill_full(p, n, 7);
  void* dev = nullptr;
  CHECK(cudaMalloc(&dev, n));
  std::vector<unsigned char> back(n);
  CHECK(cudaMemcpy(dev, p, n, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(back.data(), dev, n, cudaMemcpyDeviceToHost));
  Check(path, "copy", std::memcmp(back.data(), p, n) == 0, "");
  unsigned flags = 0;
  rc = d.flags(&flags, p);
  Check(path, "flags_live", rc == 0, Codes({rc, flags}));
  void* dp = nullptr;
  rc = d.devptr(&dp, p);
  Check(path, "devptr_live", rc == 0, Codes({rc, dp == p}));
  // 2. After the free: pointer queries answer as for freed memory.
  rc = d.free(p);
  Check(path, "free", rc == 0, Codes({rc}));
  flags = 12345;
  const int frc = d.flags(&flags, p);
  dp = nullptr;
  const int drc = d.devptr(&dp, p);
  cudaPointerAttributes attr{};
  const int arc = cudaPointerGetAttributes(&attr, p);
  cudaGetLastError();
  Check(path, "queries_after_free", frc != 0 && drc != 0, Codes({frc, drc, arc, attr.type}));
  // 3. A double free gets the driver's answer for freed memory.
  void* q = nullptr;
  rc = d.alloc(&q, n, cudaHostAllocDefault);
  const int f1 = d.free(q);
  const int f2 = d.free(q);
  cudaGetLastError();
  Check(path, "double_free", rc == 0 && f1 == 0 && f2 != 0, Codes({rc, f1, f2}));
  // 4. Freed and allocated again: reads as zeros, the flags of a fresh one.
  const unsigned kFlags[] = {cudaHostAllocDefault, cudaHostAllocPortable, cudaHostAllocMapped,
                             cudaHostAllocWriteCombined, cudaHostAllocPortable | cudaHostAllocMapped};
  for (unsigned f : kFlags) {
    void* a = nullptr;
    void* b = nullptr;
    unsigned fa = 0, fb = 0;
    const int ra = d.alloc(&a, 2 * n + 100, f);
    if (ra == 0) {
      d.flags(&fa, a);
      std::memset(a, 0xab, 2 * n + 100);
      d.free(a);
    }
    const int rb = d.alloc(&b, 2 * n + 100, f);
    bool zero = false;
    if (rb == 0) {
      d.flags(&fb, b);
      zero = AllZero(b, 2 * n + 100);
      d.free(b);
    }
    const std::string name = "reuse_flags_" + std::to_string(f);
    Check(path, name.c_str(), ra == 0 && rb == 0 && zero && fa == fb, Codes({ra, rb, zero, fa, fb}));
  }
  void* m = nullptr;
  rc = d.malloc(&m, 3 * n);
  unsigned fm = 0;
  if (rc == 0) d.flags(&fm, m);
  const int mf = rc == 0 ? d.free(m) : -1;
  Check(path, "malloc_host", rc == 0 && mf == 0, Codes({rc, fm, mf}));
  // 5. A free waits for the device, as the driver's does: a copy in flight
  // into another buffer is complete when it returns.
  void* big = nullptr;
  void* other = nullptr;
  const size_t bn = 64 << 20;
  void* dbig = nullptr;
  CHECK(cudaMalloc(&dbig, bn));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  rc = d.alloc(&big, bn, 0);
  const int ro = d.alloc(&other, n, 0);
  int q1 = -1, fr = -1;
  if (rc == 0 && ro == 0) {
    for (int i = 0; i < 8; ++i) CHECK(cudaMemcpyAsync(big, dbig, bn, cudaMemcpyDeviceToHost, s));
    fr = d.free(other);
    q1 = cudaStreamQuery(s);
    CHECK(cudaStreamSynchronize(s));
    d.free(big);
  }
  Check(path, "free_waits", rc == 0 && ro == 0 && fr == 0 && q1 == 0, Codes({rc, ro, fr, q1}));
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(dbig));
  CHECK(cudaFree(dev));
}

void RunMunmapAfterFree(const Door& d) {
  const std::string path = d.name;
  const size_t n = 1 << 20;
  void* p = nullptr;
  const int ra = d.alloc(&p, n, 0);
  if (ra == 0) {
    std::memset(p, 0x77, n);
    d.free(p);
  }
  const int mu = ra == 0 ? munmap(p, n) : -1;
  void* q = nullptr;
  const int rb = d.alloc(&q, n, 0);
  const bool zero = rb == 0 && AllZero(q, n);
  const int fr = rb == 0 ? d.free(q) : -1;
  Check(path, "munmap_after_free", ra == 0 && mu == 0 && rb == 0 && zero && fr == 0,
        Codes({ra, mu, rb, zero, fr}));
}

bool g_child_cuda = false;

void RunFork(const Door& d) {
  const std::string path = d.name;
  const size_t n = 4 << 20;
  void* p = nullptr;
  if (d.alloc(&p, n, 0) != 0) return Check(path, "fork", false, "alloc");
  std::memset(p, 0x5a, n);
  d.free(p);
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    if (!g_child_cuda) _exit(0);
    void* c = nullptr;
    const int rc = d.alloc(&c, n, 0);
    const bool zero = rc == 0 && AllZero(c, n);
    const int fr = rc == 0 ? d.free(c) : -1;
    _exit(rc == 0 && zero && fr == 0 ? 0 : 10 + rc);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  // The parent goes on allocating after the fork.
  void* again = nullptr;
  const int rc = d.alloc(&again, n, 0);
  const bool zero = rc == 0 && AllZero(again, n);
  if (rc == 0) d.free(again);
  const int child = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  Check(path, "fork", child == 0 && rc == 0 && zero, Codes({child, rc, zero}));
}

void RunBench(const Door& d, const std::vector<size_t>& sizes, int cycles) {
  for (size_t n : sizes) {
    void* dev = nullptr;
    CHECK(cudaMalloc(&dev, n));
    std::vector<double> cycle_us, kept_us;
    for (int i = 0; i < cycles; ++i) {
      const double t0 = tapp::now_us();
      void* p = nullptr;
      if (d.alloc(&p, n, 0) != 0) {
        std::fprintf(stderr, "alloc %zu failed\n", n);
        std::exit(1);
      }
      std::memset(p, i & 0xff, n);
      CHECK(cudaMemcpy(dev, p, n, cudaMemcpyHostToDevice));
      if (d.free(p) != 0) std::exit(1);
      cycle_us.push_back(tapp::now_us() - t0);
    }
    void* kept = nullptr;
    if (d.alloc(&kept, n, 0) != 0) std::exit(1);
    for (int i = 0; i < cycles; ++i) {
      const double t0 = tapp::now_us();
      std::memset(kept, i & 0xff, n);
      CHECK(cudaMemcpy(dev, kept, n, cudaMemcpyHostToDevice));
      kept_us.push_back(tapp::now_us() - t0);
    }
    d.free(kept);
    const tapp::Stats c = tapp::stats(cycle_us);
    const tapp::Stats k = tapp::stats(kept_us);
    std::printf("RESULT app=hostalloc path=%s size=%zu op=cycle cycles=%d median_us=%.2f p90_us=%.2f\n",
                d.name, n, cycles, c.median, c.p90);
    std::printf("RESULT app=hostalloc path=%s size=%zu op=kept cycles=%d median_us=%.2f p90_us=%.2f "
                "ratio=%.2f\n",
                d.name, n, cycles, k.median, k.p90, k.median > 0 ? c.median / k.median : 0.0);
    CHECK(cudaFree(dev));
  }
}

}  // namespace

int main(int argc, char** argv) {
  static const char kUsage[] =
      "hostalloc [--path runtime|driver|getproc|dlsym|all] [--check] [--bench] [--fork]\n"
      "          [--fork-child-cuda] [--munmap-after-free]\n"
      "          [--sizes 4M,64M] [--cycles N] [--idle-wait-ms N]\n";
  tapp::Args args(argc, argv, {"path", "sizes", "cycles", "idle-wait-ms"},
                  {"check", "bench", "fork", "fork-child-cuda", "munmap-after-free"}, kUsage);
  g_child_cuda = args.has("fork-child-cuda");
  const std::string which = args.str("path", "all");
  const bool check = args.has("check");
  const bool bench = args.has("bench");
  const bool do_fork = args.has("fork");
  const int cycles = static_cast<int>(args.num("cycles", 20));
  const long long idle_wait_ms = args.num("idle-wait-ms", 0);
  const std::vector<size_t> sizes = args.sizes("sizes", "4M,64M");
  CHECK(cudaFree(nullptr));  // the primary context, current on this thread
  std::vector<std::string> paths;
  if (which == "all") paths = {"runtime", "driver", "getproc", "dlsym"};
  else paths = {which};
  for (const std::string& path : paths) {
    Door d{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
    if (path == "runtime") {
      d = Door{"runtime", &RtAlloc, &RtMalloc, &RtFree, &RtFlags, &RtDevPtr};
    } else if (SetDriverDoor(path)) {
      d = Door{nullptr, &CuAlloc, &CuMalloc, &CuFree, &CuFlags, &CuDevPtr};
      d.name = path == "driver" ? "driver" : path == "dlsym" ? "dlsym" : "getproc";
    } else {
      std::fprintf(stderr, "path %s: cannot reach the driver's entry points\n", path.c_str());
      return 2;
    }
    if (check) RunChecks(d);
    if (do_fork) RunFork(d);
    if (args.has("munmap-after-free")) RunMunmapAfterFree(d);
    if (bench) RunBench(d, sizes, cycles);
    if (idle_wait_ms > 0) {
      void* p = nullptr;
      if (d.alloc(&p, 1 << 20, 0) == 0) d.free(p);
      usleep(static_cast<useconds_t>(idle_wait_ms) * 1000);
    }
  }
  std::printf("DONE failures=%d\n", g_failures);
  return g_failures == 0 ? 0 : 1;
}
