// autopin.cc: repeated host<->device copies from pageable (malloc'd or
// mmap'd) memory, through one door and one copy form, checking everything a
// program can observe: the bytes (an async host-to-device copy takes the
// source as of the call, an async device-to-host copy is complete on
// return), return codes, pointer queries, the program's own register and
// unregister of that memory afterwards, and what fork, free, munmap,
// madvise and raw system calls leave. It prints the same lines with or
// without lazypin (LAZYPIN_AUTOPIN=1 pins the memory behind its back); the
// lines starting "diag:" (stderr) say what the driver holds, which differs.
//
// CLI: autopin --door runtime|symbol|dlsym|getproc|getproc_pt --form FORM
//              [--scenario basic|threads|queries|invalidate|fork|bounds|small|capture|shared|partial|idle|
//                          overlap]
//              [--size 8M] [--iters 4]
// FORM: htod (HtoD/DtoH), async (HtoDAsync/DtoHAsync), any (cuMemcpy:
// unified), any_async, 2d, 2d_async, 2du (cuMemcpy2DUnaligned, driver doors),
// 3d, 3d_async. The runtime door maps them to cudaMemcpy(Async), with
// cudaMemcpyDefault for any, cudaMemcpy2D(Async) and cudaMemcpy3D(Async).
// Exit: 0 ok; 1 a CUDA call failed unexpectedly; 2 a byte differs.
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

namespace {

std::string g_door, g_form;
cudaStream_t g_stream;
void* g_cuda;  // libcuda.so.1

#define DIE(...) (fprintf(stderr, "autopin: " __VA_ARGS__), fputc('\n', stderr), exit(1))

// The driver's copy functions, taken through the chosen door.
struct Driver {
  CUresult (*htod)(CUdeviceptr, const void*, size_t);
  CUresult (*dtoh)(void*, CUdeviceptr, size_t);
  CUresult (*htod_async)(CUdeviceptr, const void*, size_t, CUstream);
  CUresult (*dtoh_async)(void*, CUdeviceptr, size_t, CUstream);
  CUresult (*any)(CUdeviceptr, CUdeviceptr, size_t);
  CUresult (*any_async)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*c2d)(const CUDA_MEMCPY2D*);
  CUresult (*c2d_async)(const CUDA_MEMCPY2D*, CUstream);
  CUresult (*c2du)(const CUDA_MEMCPY2D*);
  CUresult (*c3d)(const CUDA_MEMCPY3D*);
  CUresult (*c3d_async)(const CUDA_MEMCPY3D*, CUstream);
  CUresult (*attribute)(void*, CUpointer_attribute, CUdeviceptr);
} D;

template <typename Fn>
void Take(Fn* slot, Fn linked, const char* symbol, const char* proc) {
  void* fn = nullptr;
  if (g_door == "symbol" || g_door == "runtime") {
    fn = reinterpret_cast<void*>(linked);  // the linked symbol (interposed by a preload)
  } else if (g_door == "dlsym") {
    fn = dlsym(g_cuda, symbol);
  } else {
    using Getter = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
    static Getter getter = reinterpret_cast<Getter>(dlsym(g_cuda, "cuGetProcAddress_v2"));
    if (getter == nullptr) DIE("no cuGetProcAddress_v2");
    const cuuint64_t flags = g_door == "getproc_pt" ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                                    : CU_GET_PROC_ADDRESS_LEGACY_STREAM;
    CUdriverProcAddressQueryResult status;
    if (getter(proc, &fn, 12000, flags, &status) != CUDA_SUCCESS) fn = nullptr;
  }
  if (fn == nullptr) DIE("no %s through %s", symbol, g_door.c_str());
  *slot = reinterpret_cast<Fn>(fn);
}

void TakeDriver() {
  g_cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (g_cuda == nullptr) DIE("dlopen libcuda.so.1: %s", dlerror());
  Take(&D.htod, &cuMemcpyHtoD, "cuMemcpyHtoD_v2", "cuMemcpyHtoD");
  Take(&D.dtoh, &cuMemcpyDtoH, "cuMemcpyDtoH_v2", "cuMemcpyDtoH");
  Take(&D.htod_async, &cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync");
  Take(&D.dtoh_async, &cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync");
  Take(&D.any, &cuMemcpy, "cuMemcpy", "cuMemcpy");
  Take(&D.any_async, &cuMemcpyAsync, "cuMemcpyAsync", "cuMemcpyAsync");
  Take(&D.c2d, &cuMemcpy2D, "cuMemcpy2D_v2", "cuMemcpy2D");
  Take(&D.c2d_async, &cuMemcpy2DAsync, "cuMemcpy2DAsync_v2", "cuMemcpy2DAsync");
  Take(&D.c2du, &cuMemcpy2DUnaligned, "cuMemcpy2DUnaligned_v2", "cuMemcpy2DUnaligned");
  Take(&D.c3d, &cuMemcpy3D, "cuMemcpy3D_v2", "cuMemcpy3D");
  Take(&D.c3d_async, &cuMemcpy3DAsync, "cuMemcpy3DAsync_v2", "cuMemcpy3DAsync");
  Take(&D.attribute, &cuPointerGetAttribute, "cuPointerGetAttribute", "cuPointerGetAttribute");
}

bool Async() { return g_form.find("async") != std::string::npos; }
constexpr size_t kRows = 8;

CUDA_MEMCPY2D Copy2D(void* dst, const void* src, size_t n, bool to_device) {
  CUDA_MEMCPY2D c;
  memset(&c, 0, sizeof c);
  const CUmemorytype dev = g_form.rfind("2du", 0) == 0 ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_UNIFIED;
  c.srcMemoryType = to_device ? CU_MEMORYTYPE_HOST : dev;
  c.dstMemoryType = to_device ? dev : CU_MEMORYTYPE_HOST;
  if (to_device) {
    c.srcHost = src;
    c.dstDevice = reinterpret_cast<CUdeviceptr>(dst);
  } else {
    c.srcDevice = reinterpret_cast<CUdeviceptr>(src);
    c.dstHost = dst;
  }
  c.WidthInBytes = c.srcPitch = c.dstPitch = n / kRows;
  c.Height = kRows;
  return c;
}

CUDA_MEMCPY3D Copy3D(void* dst, const void* src, size_t n, bool to_device) {
  const CUDA_MEMCPY2D p = Copy2D(dst, src, n, to_device);
  CUDA_MEMCPY3D c;
  memset(&c, 0, sizeof c);
  c.srcMemoryType = p.srcMemoryType, c.dstMemoryType = p.dstMemoryType;
  c.srcHost = p.srcHost, c.dstHost = p.dstHost, c.srcDevice = p.srcDevice, c.dstDevice = p.dstDevice;
  c.WidthInBytes = c.srcPitch = c.dstPitch = n / kRows / 2;
  c.Height = c.srcHeight = c.dstHeight = 2;
  c.Depth = kRows;
  return c;
}

cudaMemcpy3DParms Parms3D(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  cudaMemcpy3DParms p;
  memset(&p, 0, sizeof p);
  p.srcPtr = make_cudaPitchedPtr(const_cast<void*>(src), n / kRows / 2, n / kRows / 2, 2);
  p.dstPtr = make_cudaPitchedPtr(dst, n / kRows / 2, n / kRows / 2, 2);
  p.extent = make_cudaExtent(n / kRows / 2, 2, kRows);
  p.kind = kind;
  return p;
}

// One copy of `n` bytes in the chosen form and door; returns the code.
int Copy(void* dst, const void* src, size_t n, bool to_device) {
  const bool async = Async();
  const std::string form = g_form.substr(0, g_form.find('_'));
  if (g_door == "runtime") {
    const cudaMemcpyKind kind = form == "any"  ? cudaMemcpyDefault
                                : to_device    ? cudaMemcpyHostToDevice
                                               : cudaMemcpyDeviceToHost;
    if (form == "2d") {
      const size_t w = n / kRows;
      return async ? cudaMemcpy2DAsync(dst, w, src, w, w, kRows, kind, g_stream)
                   : cudaMemcpy2D(dst, w, src, w, w, kRows, kind);
    }
    if (form == "3d") {
      const cudaMemcpy3DParms p = Parms3D(dst, src, n, kind);
      return async ? cudaMemcpy3DAsync(&p, g_stream) : cudaMemcpy3D(&p);
    }
    return async ? cudaMemcpyAsync(dst, src, n, kind, g_stream) : cudaMemcpy(dst, src, n, kind);
  }
  const CUstream s = reinterpret_cast<CUstream>(g_stream);
  const CUdeviceptr dd = reinterpret_cast<CUdeviceptr>(dst), ds = reinterpret_cast<CUdeviceptr>(src);
  if (form == "htod") {
    return to_device ? D.htod(dd, src, n) : D.dtoh(dst, ds, n);
  }
  if (form == "async") {
    return to_device ? D.htod_async(dd, src, n, s) : D.dtoh_async(dst, ds, n, s);
  }
  if (form == "any") return async ? D.any_async(dd, ds, n, s) : D.any(dd, ds, n);
  if (form == "2d" || form == "2du") {
    const CUDA_MEMCPY2D c = Copy2D(dst, src, n, to_device);
    return form == "2du" ? D.c2du(&c) : async ? D.c2d_async(&c, s) : D.c2d(&c);
  }
  if (form == "3d") {
    const CUDA_MEMCPY3D c = Copy3D(dst, src, n, to_device);
    return async ? D.c3d_async(&c, s) : D.c3d(&c);
  }
  DIE("unknown --form %s", g_form.c_str());
}

void Fill(void* p, size_t n, unsigned seed) {
  auto* w = static_cast<uint32_t*>(p);
  for (size_t i = 0; i < n / 4; ++i) w[i] = seed * 2654435761u + static_cast<uint32_t>(i);
}
bool Same(const void* p, size_t n, unsigned seed) {
  auto* w = static_cast<const uint32_t*>(p);
  for (size_t i = 0; i < n / 4; ++i) {
    if (w[i] != seed * 2654435761u + static_cast<uint32_t>(i)) return false;
  }
  return true;
}

// Keeps the stream busy, so that a copy queued behind it runs later (if
// pinned). The simulator "runs" any function for SIMCUDA_KERNEL_US; a real
// GPU refuses this host function (no kernel: this app is plain C++), and then
// nothing keeps the stream busy but the copies themselves.
__attribute__((noinline)) void Kernel() {}
void Busy() {
  static bool launches = true;
  if (!launches) return;
  void* args[1] = {nullptr};
  if (cudaLaunchKernel(reinterpret_cast<const void*>(&Kernel), dim3(1), dim3(1), args, 0, g_stream) !=
      cudaSuccess) {
    cudaGetLastError();
    launches = false;
  }
}

// One round trip: host `h` (filled with `seed`) to device `d`, then back into
// `back`. With `pageable` (the program has not registered `h`), an async H2D's
// source is overwritten at once and an async D2H's destination is read before
// any synchronize, as a pageable copy allows; else only after a synchronize.
void RoundTrip(const char* what, void* h, void* d, void* back, size_t n, unsigned seed,
               bool pageable = true) {
  Fill(h, n, seed);
  Busy();
  int rc = Copy(d, h, n, true);
  if (!pageable && cudaStreamSynchronize(g_stream) != cudaSuccess) DIE("sync");
  if (Async()) Fill(h, n, seed + 1000);  // a pageable H2D has taken the bytes already
  printf("%s h2d rc=%d\n", what, rc);
  memset(back, 0, n);
  Busy();
  rc = Copy(back, d, n, false);
  if (!pageable && cudaStreamSynchronize(g_stream) != cudaSuccess) DIE("sync");
  const bool same = Same(back, n, seed);  // pageable: before any synchronize, complete on return
  printf("%s d2h rc=%d bytes=%s\n", what, rc, same ? "ok" : "DIFFER");
  if (cudaStreamSynchronize(g_stream) != cudaSuccess) DIE("sync");
  if (!same) exit(2);
}

unsigned long Live() {
  using Fn = unsigned long (*)();
  auto fn = reinterpret_cast<Fn>(dlsym(g_cuda, "simcuda_live_registrations"));
  return fn ? fn() : 0;
}

void Queries(const char* what, void* h) {
  CUmemorytype type;
  const int rc = D.attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, reinterpret_cast<CUdeviceptr>(h));
  cudaPointerAttributes attr;
  const int rrc = cudaPointerGetAttributes(&attr, h);
  unsigned flags = 0;
  const int frc = cudaHostGetFlags(&flags, h);
  cudaGetLastError();
  printf("%s query rc=%d runtime rc=%d type=%d hostflags rc=%d\n", what, rc, rrc,
         rrc == 0 ? static_cast<int>(attr.type) : -1, frc);
}

void* MapAnon(size_t n, int flags = MAP_PRIVATE) {
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, flags | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) DIE("mmap");
  return p;
}

// --scenario overlap: copies over a range the program no longer holds
// registered but the driver may (lazypin keeps it: a register and unregister
// of the program's, or an auto-pin by a copy of exactly that range), each a
// round trip through one span that lies inside the kept range, starts inside
// and runs past it, ends inside it, or covers it. Bare, every one is a
// pageable copy (0, the bytes); the driver refuses one that starts inside a
// registration it holds and runs past it (1), so lazypin must let the driver
// see what it would see bare. Last, the same over a range the program still
// holds: the driver's answer (1 for a span past it) is the program's.
// Every step has a region of its own, so each kept range is kept once.
void Overlap(void* d, size_t n) {
  const size_t k = n / 2;  // the kept range: k bytes, n / 2 into the step's region
  struct Step {
    const char* name;
    size_t from;  // the span's offset from the kept range's start, minus k / 2
    size_t bytes;
  };
  const Step steps[] = {
      {"inside", k / 2 + k / 4, k / 2},  // [kept + k/4, kept + 3k/4)
      {"exact", k / 2, k},               // the kept range itself
      {"starts inside", k / 2, n},       // [kept, kept + n): runs k past its end
      {"starts inside, later", k, n},    // [kept + k/2, kept + k/2 + n)
      {"ends inside", 0, k},             // [kept - k/2, kept + k/2)
      {"covers", 0, 2 * k},              // [kept - k/2, kept + 3k/2)
  };
  const size_t region = 2 * n;
  for (const char* kept : {"deferred", "autopinned"}) {
    char* base = static_cast<char*>(MapAnon(region * (sizeof steps / sizeof steps[0])));
    unsigned seed = kept[0] == 'd' ? 100 : 200;
    for (const Step& step : steps) {
      char* r = base + region * (&step - steps);
      char* keep = r + n / 2;
      fprintf(stderr, "diag: kept=%s step=%s range=%p\n", kept, step.name, static_cast<void*>(keep));
      const std::string what = std::string(kept) + " " + step.name;
      if (kept[0] == 'd') {
        const int rr = cudaHostRegister(keep, k, 0);
        printf("%s: register=%d unregister=%d\n", what.c_str(), rr, cudaHostUnregister(keep));
      } else {
        RoundTrip((what + " pin").c_str(), keep, d, keep, k, seed++);  // auto-pins it
      }
      char* span = keep - k / 2 + step.from;
      RoundTrip(what.c_str(), span, d, span, step.bytes, seed++);
      RoundTrip((what + " again").c_str(), span, d, span, step.bytes, seed++);
    }
    munmap(base, region * (sizeof steps / sizeof steps[0]));
  }
  // The program's own registration: the driver answers, as bare.
  char* h = static_cast<char*>(MapAnon(2 * n));
  printf("held: register=%d\n", cudaHostRegister(h, k, 0));
  Fill(h, n, 7);
  printf("held starts inside h2d rc=%d\n", Copy(d, h, n, true));
  printf("held starts inside d2h rc=%d\n", Copy(h, d, n, false));
  printf("held sync rc=%d\n", cudaStreamSynchronize(g_stream));
  cudaGetLastError();
  printf("held: unregister=%d\n", cudaHostUnregister(h));
  // Starting before the program's registration and running into it: the
  // simulator takes it as pageable (0); what the real driver says shows here.
  printf("held later: register=%d\n", cudaHostRegister(h + k, k, 0));
  printf("held ends inside h2d rc=%d\n", Copy(d, h, n, true));
  printf("held ends inside d2h rc=%d\n", Copy(h, d, n, false));
  printf("held later sync rc=%d\n", cudaStreamSynchronize(g_stream));
  cudaGetLastError();
  printf("held later: unregister=%d\n", cudaHostUnregister(h + k));
  munmap(h, 2 * n);
}

}  // namespace

int main(int argc, char** argv) {
  std::string scenario = "basic";
  size_t n = 8 << 20;
  int iters = 4;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--door") g_door = v;
    else if (k == "--form") g_form = v;
    else if (k == "--scenario") scenario = v;
    else if (k == "--size") n = strtoull(v.c_str(), nullptr, 0) << 20;
    else if (k == "--iters") iters = atoi(v.c_str());
    else DIE("unknown option %s", k.c_str());
  }
  if (g_door.empty() || g_form.empty()) DIE("usage: autopin --door D --form F [--scenario S]");
  if (cudaSetDevice(0) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) DIE("no device");
  TakeDriver();
  if (cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) != cudaSuccess) DIE("stream");
  void* d = nullptr;
  if (cudaMalloc(&d, n) != cudaSuccess) DIE("cudaMalloc");
  void* back = malloc(n);

  if (scenario == "basic" || scenario == "small" || scenario == "idle") {
 void* h = malloc(n);
    fprintf(stderr, "diag: h=%p back=%p\n", h, back);
    for (int i = 0; i < iters; ++i) RoundTrip(("iter " + std::to_string(i)).c_str(), h, d, back, n, i);
    fprintf(stderr, "diag: live=%lu\n", Live());
    if (scenario == "idle") {
      usleep(800 * 1000);
      fprintf(stderr, "diag: after idle live=%lu\n", Live());
    }
    Queries("after copies", h);
    RoundTrip("after query", h, d, back, n, 50);
    printf("register exact rc=%d\n", cudaHostRegister(h, n, 0));
    RoundTrip("registered", h, d, back, n, 51, /*pageable=*/false);
    printf("register again rc=%d\n", cudaHostRegister(h, n, 0));
    cudaGetLastError();
    printf("unregister rc=%d\n", cudaHostUnregister(h));
    RoundTrip("unregistered", h, d, back, n, 52);
    char* sub = static_cast<char*>(h) + 8192;
    printf("register sub rc=%d\n", cudaHostRegister(sub, n / 2, cudaHostRegisterPortable));
    printf("unregister sub rc=%d\n", cudaHostUnregister(sub));
    printf("unregister twice rc=%d\n", cudaHostUnregister(h));
    cudaGetLastError();
    RoundTrip("last", h, d, back, n, 53);
    free(h);
  } else if (scenario == "threads") {
    // Four threads copy the same source (each to its own device buffer and
    // back, on its own stream) while the main thread queries it: every pin,
    // query release and re-pin of one range races with the others' copies.
    void* h = malloc(n);
    Fill(h, n, 5);
    std::vector<std::thread> threads;
    std::vector<int> bad(4, 0);
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        cudaSetDevice(0);
        cudaStream_t s;
        void* dt = nullptr;
        void* bt = malloc(n);
        if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
            cudaMalloc(&dt, n) != cudaSuccess) {
          bad[t] = 1;
          return;
        }
        for (int i = 0; i < iters; ++i) {
          memset(bt, 0, n);
          if (cudaMemcpyAsync(dt, h, n, cudaMemcpyHostToDevice, s) != cudaSuccess ||
              cudaMemcpyAsync(bt, dt, n, cudaMemcpyDeviceToHost, s) != cudaSuccess ||
              cudaStreamSynchronize(s) != cudaSuccess || !Same(bt, n, 5)) {
            bad[t] = 1;
          }
        }
        cudaFree(dt);
        cudaStreamDestroy(s);
        free(bt);
      });
    }
    for (int i = 0; i < iters; ++i) {
      cudaPointerAttributes attr;
      cudaPointerGetAttributes(&attr, h);
      usleep(1000);
    }
    for (auto& t : threads) t.join();
    for (int t = 0; t < 4; ++t) printf("thread %d bytes=%s\n", t, bad[t] ? "DIFFER" : "ok");
    free(h);
    for (int b : bad) if (b) exit(2);
  } else if (scenario == "queries") {
    // A program that asks about its memory before every copy.
    void* h = malloc(n);
    fprintf(stderr, "diag: h=%p back=%p\n", h, back);
    for (int i = 0; i < iters; ++i) {
      Queries("before copy", h);
      RoundTrip(("iter " + std::to_string(i)).c_str(), h, d, back, n, i);
    }
    free(h);
  } else if (scenario == "invalidate") {
    // Every way the pages change under a (possibly auto-pinned) range.
    char* m = static_cast<char*>(MapAnon(n));
    RoundTrip("mmap", m, d, back, n, 1);
    munmap(m, n);
    if (mmap(m, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != m) DIE("remap");
    RoundTrip("munmap+mmap", m, d, back, n, 2);
    madvise(m, n, MADV_DONTNEED);
    RoundTrip("madvise", m, d, back, n, 3);
    syscall(SYS_munmap, m, n);  // no hook sees this: the kernel watch does
    if (mmap(m, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != m) DIE("remap");
    RoundTrip("raw munmap", m, d, back, n, 4);
    syscall(SYS_madvise, m, n, MADV_DONTNEED);
    RoundTrip("raw madvise", m, d, back, n, 5);
    if (mmap(m, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != m) DIE("remap");
    RoundTrip("mmap fixed", m, d, back, n, 6);
    munmap(m, n);
    for (int i = 0; i < 3; ++i) {
      void* h = malloc(n);
      RoundTrip(("malloc " + std::to_string(i)).c_str(), h, d, back, n, 10 + i);
      free(h);
    }
  } else if (scenario == "fork") {
    void* h = malloc(n);
    RoundTrip("before fork", h, d, back, n, 1);
    const pid_t pid = fork();
    if (pid == 0) {
      Fill(h, n, 77);
      _exit(Same(h, n, 77) ? 0 : 3);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    printf("child status=%d\n", status);
    RoundTrip("after fork", h, d, back, n, 2);
    free(h);
  } else if (scenario == "bounds") {
    void* a = malloc(n);
    void* b = malloc(n);
    for (int i = 0; i < iters; ++i) {
      RoundTrip("a", a, d, back, n, i);
      RoundTrip("b", b, d, back, n, 100 + i);
    }
    fprintf(stderr, "diag: live=%lu\n", Live());
    free(a);
    free(b);
  } else if (scenario == "capture") {
    void* h = malloc(n);
    Fill(h, n, 9);
    cudaGraph_t graph;
    printf("begin rc=%d\n", cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeGlobal));
    printf("captured copy rc=%d\n", Copy(d, h, n, true));
    const int end = cudaStreamEndCapture(g_stream, &graph);
    printf("end rc=%d\n", end);
    cudaGetLastError();
    fprintf(stderr, "diag: live after capture=%lu\n", Live());
    RoundTrip("after capture", h, d, back, n, 10);
    free(h);
  } else if (scenario == "shared") {
    void* h = MapAnon(n, MAP_SHARED);
    for (int i = 0; i < iters; ++i) RoundTrip("shared", h, d, back, n, i);
    fprintf(stderr, "diag: live=%lu\n", Live());
    munmap(h, n);
  } else if (scenario == "partial") {
    // The program registers the back half; each copy starts before it (in no
    // registration: pageable to the driver) and runs into it.
    char* h = static_cast<char*>(malloc(n));
    fprintf(stderr, "diag: h=%p back=%p\n", static_cast<void*>(h), back);
    printf("register half rc=%d\n", cudaHostRegister(h + n / 2, n / 2, 0));
    for (int i = 0; i < iters; ++i) RoundTrip("partial", h, d, back, n, i, /*pageable=*/false);
    fprintf(stderr, "diag: live=%lu\n", Live());
    printf("unregister half rc=%d\n", cudaHostUnregister(h + n / 2));
    free(h);
  } else if (scenario == "overlap") {
    Overlap(d, n);
  } else {
    DIE("unknown --scenario %s", scenario.c_str());
  }
  cudaFree(d);
  free(back);
  printf("AUTOPIN ok\n");
  return 0;
}
