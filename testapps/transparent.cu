// transparent.cu: what a program observes around memory it has unregistered.
// One case per run (--case NAME); without --case it runs every
// case, each in a fresh process (some change the process's CUDA state for good).
// Every line is what the program can see: return codes, a verdict on bytes,
// cudaStreamQuery right after an unregister, whether a context is current and
// the next driver call's code, and the pointer queries. The output (stdout) is
// deterministic and must be the same with and without lazypin; timings go to
// stderr only. Raw pointers are never printed.
//
// Cases:
//   wait      the implicit wait: a --kernel-ms spin kernel, then an async
//             64 MiB device-to-host copy into registered B on the same
//             stream, then the unregister of another buffer A (runtime,
//             driver, cudaFreeHost): B's bytes and cudaStreamQuery right after
//   pageable  a registered-then-unregistered buffer used as pageable memory
//             (64 KiB, 4 MiB, 64 MiB; cudaMemcpyAsync, cuMemcpy{HtoD,DtoH}Async,
//             cudaMemcpy2DAsync, cuMemcpy2DAsync, cudaMemcpy3DAsync) behind a
//             spin kernel: host-to-device then an immediate memset (the device
//             must get the bytes as of the call); device-to-host then an
//             immediate read (must be complete). One pinned control line.
//   hostwait  a registered-then-unregistered buffer (64 KiB, 4 MiB, 20 MiB;
//             cudaMemcpyAsync, cuMemcpyHtoDAsync) as the source of an async
//             host-to-device copy behind a spin kernel: cudaStreamQuery right
//             after, and the same behind a host function that waits (at most
//             5 s) for a flag the program sets only after the copy returned.
//             Whether the copy waits for the stream is the driver's choice
//             (small copies are staged and return; larger ones wait); the
//             query is printed while the work ahead still runs (600), and as
//             "-" once it ended (the copy's own end races the query)
//   remap     free / munmap while registered, then the unregister, then the
//             address mapped again: register, copy, verify
//   noctx     driver API: the unregister with no current context, then with one
//   primary   driver API: the primary context released to 0 with one buffer
//             unregistered and one registered, then retained again
//   thread    cudaHostUnregister / cudaHostRegister from new threads, then a
//             driver call on that thread
//   mprotect  register after mprotect(PROT_READ), PROT_NONE, and back
//   fork      fork with --fork-bytes registered then unregistered; the child
//             touches nothing but says whether it holds a private copy of
//             the buffer (smaps_rollup Private_Dirty at least half of it:
//             pinned pages are copied at fork); the fork's wall time on stderr
//   capture   unregister during another thread's stream capture: global mode,
//             relaxed mode, driver API; cudaDeviceSynchronize in relaxed mode
//   queries   a 4 MiB buffer registered, copied and unregistered 6 times with
//             every pointer query after each unregister (PyTorch's
//             is_pinned() asks cudaPointerGetAttributes): each answer field by
//             field, cudart's last error after each, and the copy's bytes
//
// CLI: transparent [--case NAME] [--kernel-ms 100] [--fork-bytes 256M]
// On the simulator a launch lasts SIMCUDA_KERNEL_US whatever --kernel-ms says.
// Exit: 0 whatever the codes; 1 on a setup failure.
#include "common.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <spawn.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include <atomic>
#include <string>
#include <thread>

extern char** environ;

namespace {

const char* kUsage = "usage: transparent [--case NAME] [--kernel-ms 100] [--fork-bytes 256M]\n";
const char* kCases[] = {"wait", "pageable", "hostwait", "remap", "noctx", "primary",
                        "thread", "mprotect", "fork", "capture", "queries"};

constexpr size_t kMiB = 1 << 20;
long long g_cycles = 0;  // spin kernel length in clock cycles

__global__ void spin(long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

using tapp::out;

void* map(size_t n) {
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  return p;
}

// Bytes at p compared with the expected pattern ref and with the fill byte
// the buffer held before: complete, untouched or partial.
const char* verdict(const void* p, const void* ref, size_t n, unsigned char before) {
  if (std::memcmp(p, ref, n) == 0) return "complete";
  const unsigned char* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i)
    if (b[i] != before) return "partial";
  return "untouched";
}

// What the device got from a host-to-device copy whose source the program
// overwrote with `later` right after the call.
const char* h2d_verdict(const void* got, const void* ref, size_t n, unsigned char later) {
  const char* v = verdict(got, ref, n, later);
  return std::strcmp(v, "complete") == 0 ? "bytes-of-the-call"
         : std::strcmp(v, "untouched") == 0 ? "later-bytes"
                                            : "mixed";
}

// The program-visible state of host memory p: cudaPointerGetAttributes type,
// cuMemHostGetFlags code, cudaHostGetDevicePointer code.
std::string rt_queries(void* p) {
  cudaPointerAttributes a;
  std::memset(&a, 0, sizeof a);
  int pa = cudaPointerGetAttributes(&a, p);
  unsigned f = 0;
  int gf = cuMemHostGetFlags(&f, p);
  void* d = nullptr;
  int dp = cudaHostGetDevicePointer(&d, p, 0);
  cudaGetLastError();
  char b[160];
  std::snprintf(b, sizeof b, "ptrattr=%d type=%d getflags=%d devptr=%d", pa,
                pa == 0 ? static_cast<int>(a.type) : -1, gf, dp);
  return b;
}

// The same through the driver only (cases that must not touch the runtime).
std::string drv_queries(void* p) {
  unsigned type = 0;
  int pa = cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                 reinterpret_cast<CUdeviceptr>(p));
  unsigned f = 0;
  int gf = cuMemHostGetFlags(&f, p);
  CUdeviceptr d = 0;
  int dp = cuMemHostGetDevicePointer(&d, p, 0);
  char b[160];
  std::snprintf(b, sizeof b, "ptrattr=%d getflags=%d flags=%u devptr=%d", pa, gf, gf == 0 ? f : 0,
                dp);
  return b;
}

void rt_setup(cudaStream_t* s) {
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));
  int khz = 0;
  CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  g_cycles = static_cast<long long>(g_cycles) * khz;  // g_cycles holds ms until here
  if (s) CHECK(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
}

void spin_on(cudaStream_t s) {
  spin<<<1, 1, 0, s>>>(g_cycles);
  CHECK(cudaGetLastError());
}

// ------------------------------------------------------------------ wait ----
void case_wait() {
  cudaStream_t s;
  rt_setup(&s);
  const size_t n = 64 * kMiB;
  unsigned char* ref = static_cast<unsigned char*>(tapp::alloc_aligned(n));
  tapp::fill_full(ref, n, 14);
  void* dev = nullptr;
  CHECK(cudaMalloc(&dev, n));
  CHECK(cudaMemcpy(dev, ref, n, cudaMemcpyHostToDevice));
  unsigned char* b = static_cast<unsigned char*>(tapp::alloc_aligned(n));
  out("register B=%d", cudaHostRegister(b, n, 0));
  for (const char* how : {"cudaHostUnregister", "cuMemHostUnregister", "cudaFreeHost"}) {
    const size_t an = 4 * kMiB;
    void* a = nullptr;
    int ra;
    if (std::strcmp(how, "cudaFreeHost") == 0) {
      ra = cudaHostAlloc(&a, an, 0);
    } else {
      a = tapp::alloc_aligned(an);
      ra = cudaHostRegister(a, an, 0);
    }
    std::memset(b, 0x5A, n);
    CHECK(cudaDeviceSynchronize());
    spin_on(s);
    int rc = cudaMemcpyAsync(b, dev, n, cudaMemcpyDeviceToHost, s);
    double t0 = tapp::now_us();
    int ru = std::strcmp(how, "cudaHostUnregister") == 0   ? static_cast<int>(cudaHostUnregister(a))
             : std::strcmp(how, "cuMemHostUnregister") == 0 ? static_cast<int>(cuMemHostUnregister(a))
                                                            : static_cast<int>(cudaFreeHost(a));
    double t1 = tapp::now_us();
    int q = cudaStreamQuery(s);
    const char* bytes = verdict(b, ref, n, 0x5A);
    std::fprintf(stderr, "wait: %s took %.0f us\n", how, t1 - t0);
    out("%s: register A=%d copy=%d unregister=%d query=%d B=%s", how, ra, rc, ru, q, bytes);
    CHECK(cudaStreamSynchronize(s));
    out("%s: after sync B=%s last=%d", how, verdict(b, ref, n, 0x5A), cudaGetLastError());
  }
  out("unregister B=%d", cudaHostUnregister(b));
}

// -------------------------------------------------------------- pageable ----
enum class Form { kRt, kDrv, kRt2D, kDrv2D, kRt3D };
const char* form_name(Form f) {
  switch (f) {
    case Form::kRt: return "cudaMemcpyAsync";
    case Form::kDrv: return "cuMemcpyAsync";
    case Form::kRt2D: return "cudaMemcpy2DAsync";
    case Form::kDrv2D: return "cuMemcpy2DAsync";
    case Form::kRt3D: return "cudaMemcpy3DAsync";
  }
  return "?";
}

// One async copy of n bytes (rows of 4 KiB for the 2D/3D forms).
int copy_async(Form f, void* dst, const void* src, size_t n, bool h2d, cudaStream_t s) {
  const size_t w = 4096, rows = n / w;
  cudaMemcpyKind kind = h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  CUstream cs = reinterpret_cast<CUstream>(s);
  switch (f) {
    case Form::kRt:
      return cudaMemcpyAsync(dst, src, n, kind, s);
    case Form::kDrv:
      return h2d ? cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(dst), src, n, cs)
                 : cuMemcpyDtoHAsync(dst, reinterpret_cast<CUdeviceptr>(src), n, cs);
    case Form::kRt2D:
      return cudaMemcpy2DAsync(dst, w, src, w, w, rows, kind, s);
    case Form::kDrv2D: {
      CUDA_MEMCPY2D c;
      std::memset(&c, 0, sizeof c);
      c.srcMemoryType = h2d ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
      c.dstMemoryType = h2d ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
      if (h2d) {
        c.srcHost = src;
        c.dstDevice = reinterpret_cast<CUdeviceptr>(dst);
      } else {
        c.srcDevice = reinterpret_cast<CUdeviceptr>(src);
        c.dstHost = dst;
      }
      c.srcPitch = c.dstPitch = w;
      c.WidthInBytes = w;
      c.Height = rows;
      return cuMemcpy2DAsync(&c, cs);
    }
    case Form::kRt3D: {
      cudaMemcpy3DParms p;
      std::memset(&p, 0, sizeof p);
      const size_t h = rows >= 16 ? 16 : rows;
      p.srcPtr = make_cudaPitchedPtr(const_cast<void*>(src), w, w, h);
      p.dstPtr = make_cudaPitchedPtr(dst, w, w, h);
      p.extent = make_cudaExtent(w, h, rows / h);
      p.kind = kind;
      return cudaMemcpy3DAsync(&p, s);
    }
  }
  return -1;
}

// ------------------------------------------------------------- hostwait ----
struct HostWait {
  std::atomic<bool> flag{false};
  std::atomic<int> waited{-1};  // -1 not run yet, 1 saw the flag, 0 gave up after 5 s
};

void CUDART_CB wait_for_flag(void* p) {
  HostWait* w = static_cast<HostWait*>(p);
  const double t0 = tapp::now_us();
  while (!w->flag.load() && tapp::now_us() - t0 < 5e6) usleep(100);
  w->waited = w->flag.load() ? 1 : 0;
}

void case_hostwait() {
  cudaStream_t s;
  rt_setup(&s);
  const size_t max = 20 * kMiB;
  void* dev = nullptr;
  CHECK(cudaMalloc(&dev, max));
  unsigned char* ref = static_cast<unsigned char*>(tapp::alloc_aligned(max));
  unsigned char* check = static_cast<unsigned char*>(tapp::alloc_aligned(max));
  cudaEvent_t ahead;
  CHECK(cudaEventCreateWithFlags(&ahead, cudaEventDisableTiming));
  for (size_t n : {size_t{64} << 10, 4 * kMiB, 20 * kMiB}) {
    const std::string sz = tapp::size_name(n);
    unsigned char* h = static_cast<unsigned char*>(tapp::alloc_aligned(n));
    std::memset(h, 0, n);
    int rr = cudaHostRegister(h, n, 0);
    int ru = cudaHostUnregister(h);
    out("%s: register=%d unregister=%d", sz.c_str(), rr, ru);
    for (Form f : {Form::kRt, Form::kDrv}) {
      for (bool host_fn : {false, true}) {
        tapp::fill_full(h, n, n + static_cast<int>(f) + (host_fn ? 7 : 0));
        std::memcpy(ref, h, n);
        CHECK(cudaDeviceSynchronize());
        spin_on(s);
        HostWait w;
        int rl = host_fn ? cudaLaunchHostFunc(s, wait_for_flag, &w) : 0;
        CHECK(cudaEventRecord(ahead, s));  // the end of the work ahead of the copy
        const double t0 = tapp::now_us();
        int rc = copy_async(f, dev, h, n, true, s);
        const double copy_us = tapp::now_us() - t0;
        int rq = cudaStreamQuery(s);
        // With the work ahead still running, the stream cannot be idle: the
        // query's answer is fixed (600). A copy that waited for that work
        // (the driver's choice for a pageable source) may or may not have
        // ended by the query: a race, bare as with lazypin, not compared.
        const bool ahead_done = cudaEventQuery(ahead) == cudaSuccess;
        const std::string query = ahead_done ? "-" : std::to_string(rq);
        std::memset(h, 0xAB, n);
        w.flag = true;
        CHECK(cudaStreamSynchronize(s));
        CHECK(cudaMemcpy(check, dev, n, cudaMemcpyDeviceToHost));
        std::fprintf(stderr, "hostwait %s %s host_fn=%d copy_us=%.0f\n", sz.c_str(),
                     form_name(f), host_fn, copy_us);
        if (host_fn) {
          out("%s %s h2d behind a waiting host function: launch=%d copy=%d query=%s "
              "host function=%s device=%s",
              sz.c_str(), form_name(f), rl, rc, query.c_str(),
              w.waited == 1 ? "saw the flag" : "gave up", h2d_verdict(check, ref, n, 0xAB));
        } else {
          out("%s %s h2d behind a kernel: copy=%d query=%s device=%s", sz.c_str(), form_name(f),
              rc, query.c_str(), h2d_verdict(check, ref, n, 0xAB));
        }
      }
    }
    std::free(h);
  }
  CHECK(cudaEventDestroy(ahead));
  CHECK(cudaFree(dev));
}

void case_pageable() {
  cudaStream_t s;
  rt_setup(&s);
  const size_t max = 64 * kMiB;
  void* dev = nullptr;
  CHECK(cudaMalloc(&dev, max));
  unsigned char* ref = static_cast<unsigned char*>(tapp::alloc_aligned(max));
  unsigned char* check = static_cast<unsigned char*>(tapp::alloc_aligned(max));
  // One pinned control: memory the program holds registered really is async.
  {
    const size_t n = 4 * kMiB;
    unsigned char* h = static_cast<unsigned char*>(tapp::alloc_aligned(n));
    int rr = cudaHostRegister(h, n, 0);
    tapp::fill_full(h, n, 1);
    std::memcpy(ref, h, n);
    CHECK(cudaDeviceSynchronize());
    spin_on(s);
    int rc = cudaMemcpyAsync(dev, h, n, cudaMemcpyHostToDevice, s);
    std::memset(h, 0xAB, n);
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(check, dev, n, cudaMemcpyDeviceToHost));
    out("control registered 4M h2d: register=%d copy=%d device=%s", rr, rc,
        h2d_verdict(check, ref, n, 0xAB));
    out("control unregister=%d", cudaHostUnregister(h));
    std::free(h);
  }
  for (size_t n : {size_t{64} << 10, 4 * kMiB, 64 * kMiB}) {
    const std::string sz = tapp::size_name(n);
    unsigned char* h = static_cast<unsigned char*>(tapp::alloc_aligned(n));
    std::memset(h, 0, n);
    int rr = cudaHostRegister(h, n, 0);
    int ru = cudaHostUnregister(h);
    out("%s: register=%d unregister=%d", sz.c_str(), rr, ru);
    for (Form f : {Form::kRt, Form::kDrv, Form::kRt2D, Form::kDrv2D, Form::kRt3D}) {
      // Host to device, then the program writes its buffer at once.
      tapp::fill_full(h, n, n + static_cast<int>(f));
      std::memcpy(ref, h, n);
      CHECK(cudaDeviceSynchronize());
      spin_on(s);
      int rc = copy_async(f, dev, h, n, true, s);
      std::memset(h, 0xAB, n);
      CHECK(cudaStreamSynchronize(s));
      CHECK(cudaMemcpy(check, dev, n, cudaMemcpyDeviceToHost));
      out("%s %s h2d: copy=%d device=%s", sz.c_str(), form_name(f), rc,
          h2d_verdict(check, ref, n, 0xAB));
      // Device to host, then the program reads its buffer at once.
      tapp::fill_full(ref, n, 2 * n + static_cast<int>(f));
      CHECK(cudaMemcpy(dev, ref, n, cudaMemcpyHostToDevice));
      std::memset(h, 0x11, n);
      spin_on(s);
      rc = copy_async(f, h, dev, n, false, s);
      const char* got = verdict(h, ref, n, 0x11);
      CHECK(cudaStreamSynchronize(s));
      out("%s %s d2h: copy=%d host=%s last=%d", sz.c_str(), form_name(f), rc, got,
          cudaGetLastError());
    }
    out("%s: %s", sz.c_str(), rt_queries(h).c_str());  // after the copies: a query may change things
    std::free(h);
  }
}

// ----------------------------------------------------------------- remap ----
// Register, copy, verify at p (n bytes); the line names the step.
void use(const char* what, void* p, size_t n, void* dev, unsigned char* check, uint64_t seed) {
  int rr = cudaHostRegister(p, n, 0);
  tapp::fill_full(p, n, seed);
  int c1 = cudaMemcpy(dev, p, n, cudaMemcpyHostToDevice);
  std::memset(check, 0, n);
  int c2 = cudaMemcpy(check, dev, n, cudaMemcpyDeviceToHost);
  out("%s: register=%d h2d=%d d2h=%d bytes=%s", what, rr, c1, c2,
      std::memcmp(check, p, n) == 0 ? "ok" : "WRONG");
}

void case_remap() {
  rt_setup(nullptr);
  const size_t n = 4 * kMiB;
  void* dev = nullptr;
  CHECK(cudaMalloc(&dev, n));
  unsigned char* check = static_cast<unsigned char*>(tapp::alloc_aligned(n));
  // munmap while registered, unregister, the same address mapped again.
  void* m = map(n);
  use("mmap first", m, n, dev, check, 1);
  out("munmap=%d", munmap(m, n));
  int ru = cudaHostUnregister(m);
  out("unregister after munmap=%d last=%d", ru, cudaGetLastError());
  // A hint, not MAP_FIXED: the kernel gives the free range back as a new mapping.
  void* again = mmap(m, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (again == MAP_FAILED) return;
  std::fprintf(stderr, "remap: mmap %s the address\n", again == m ? "reused" : "did not reuse");
  use("mmap again at the same address", again, n, dev, check, 2);
  ru = cudaHostUnregister(again);
  out("unregister=%d %s", ru, rt_queries(again).c_str());
  munmap(again, n);
  // free while registered, unregister, allocate again (often the same address).
  void* f = std::malloc(n);
  use("malloc first", f, n, dev, check, 3);
  const uintptr_t freed = reinterpret_cast<uintptr_t>(f);  // still registered when freed
  std::free(f);
  ru = cudaHostUnregister(reinterpret_cast<void*>(freed));
  out("unregister after free=%d last=%d", ru, cudaGetLastError());
  void* f2 = std::malloc(n);
  std::fprintf(stderr, "remap: malloc %s the address\n",
               reinterpret_cast<uintptr_t>(f2) == freed ? "reused" : "did not reuse");
  use("malloc again", f2, n, dev, check, 4);
  ru = cudaHostUnregister(f2);
  out("unregister=%d %s", ru, rt_queries(f2).c_str());
  std::free(f2);
}

// ----------------------------------------------------------------- noctx ----
void drv_setup(CUcontext* ctx) {
  if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(ctx, 0) != CUDA_SUCCESS ||
      cuCtxSetCurrent(*ctx) != CUDA_SUCCESS) {
    std::fprintf(stderr, "driver setup failed\n");
    std::exit(1);
  }
}

void case_noctx() {
  CUcontext ctx;
  drv_setup(&ctx);
  const size_t n = 4 * kMiB;
  void* a = tapp::alloc_aligned(n);
  out("register=%d", cuMemHostRegister(a, n, 0));
  int pops = 0;
  CUcontext c;
  while (cuCtxPopCurrent(&c) == CUDA_SUCCESS) ++pops;
  CUcontext cur = reinterpret_cast<CUcontext>(1);
  cuCtxGetCurrent(&cur);
  out("popped=%d current=%d", pops > 0, cur != nullptr);
  out("unregister without a context=%d", cuMemHostUnregister(a));
  cuCtxGetCurrent(&cur);
  CUdevice d;
  out("current after=%d ctxgetdevice=%d", cur != nullptr, static_cast<int>(cuCtxGetDevice(&d)));
  int push = cuCtxPushCurrent(ctx);
  out("push=%d %s", push, drv_queries(a).c_str());
  int ru = cuMemHostUnregister(a);
  out("unregister with the context=%d %s", ru, drv_queries(a).c_str());
  out("unregister again=%d", cuMemHostUnregister(a));
}

// --------------------------------------------------------------- primary ----
void case_primary() {
  CUcontext ctx;
  drv_setup(&ctx);
  const size_t n = 4 * kMiB;
  void* a = tapp::alloc_aligned(n);
  void* b = tapp::alloc_aligned(n);
  CUdeviceptr dev = 0;
  out("alloc=%d", cuMemAlloc(&dev, n));
  int r1 = cuMemHostRegister(a, n, 0);
  int r2 = cuMemcpyHtoD(dev, a, n);
  int r3 = cuMemHostUnregister(a);
  out("register A=%d h2d=%d unregister A=%d", r1, r2, r3);
  r1 = cuMemHostRegister(b, n, 0);
  r2 = cuMemcpyHtoD(dev, b, n);
  out("register B=%d h2d=%d", r1, r2);
  out("release=%d", cuDevicePrimaryCtxRelease(0));
  unsigned flags = 0;
  int active = -1;
  cuDevicePrimaryCtxGetState(0, &flags, &active);
  out("active after release=%d", active);
  r1 = cuDevicePrimaryCtxRetain(&ctx, 0);
  r2 = cuCtxSetCurrent(ctx);
  out("retain=%d set=%d", r1, r2);
  out("A before register: %s", drv_queries(a).c_str());
  out("B before register: %s", drv_queries(b).c_str());
  r1 = cuMemHostRegister(a, n, 0);
  out("register A=%d %s", r1, drv_queries(a).c_str());
  out("unregister B=%d", cuMemHostUnregister(b));
  r1 = cuMemHostRegister(b, n, 0);
  out("register B=%d %s", r1, drv_queries(b).c_str());
  CUdeviceptr dev2 = 0;
  out("alloc=%d", cuMemAlloc(&dev2, n));
  r1 = cuMemcpyHtoD(dev2, a, n);
  r2 = cuMemcpyHtoD(dev2, b, n);
  out("h2d A=%d h2d B=%d", r1, r2);
  r1 = cuMemHostUnregister(a);
  r2 = cuMemHostUnregister(b);
  out("unregister A=%d unregister B=%d", r1, r2);
}

// ---------------------------------------------------------------- thread ----
void case_thread() {
  rt_setup(nullptr);
  const size_t n = 4 * kMiB;
  void* a = tapp::alloc_aligned(n);
  out("register=%d", cudaHostRegister(a, n, 0));
  for (const char* call : {"cudaHostUnregister", "cudaHostRegister"}) {
    std::thread([&] {
      CUcontext cur = reinterpret_cast<CUcontext>(1);
      cuCtxGetCurrent(&cur);
      const bool before = cur != nullptr;
      int rc = std::strcmp(call, "cudaHostRegister") == 0 ? cudaHostRegister(a, n, 0)
                                                          : cudaHostUnregister(a);
      cuCtxGetCurrent(&cur);
      CUdevice d = -1;
      int gd = cuCtxGetDevice(&d);
      int sy = cuCtxSynchronize();
      out("new thread %s=%d current before=%d after=%d ctxgetdevice=%d ctxsynchronize=%d %s",
          call, rc, before, cur != nullptr, gd, sy, rt_queries(a).c_str());
    }).join();
  }
  out("unregister=%d", cudaHostUnregister(a));
}

// -------------------------------------------------------------- mprotect ----
void case_mprotect() {
  rt_setup(nullptr);
  const size_t n = 4 * kMiB;
  void* a = map(n);
  std::memset(a, 1, n);
  int rr = cudaHostRegister(a, n, 0);
  out("register=%d unregister=%d", rr, cudaHostUnregister(a));
  struct Step {
    const char* name;
    int prot;
    unsigned flags;
  };
  const Step steps[] = {{"PROT_READ", PROT_READ, 0},
                        {"PROT_READ readonly", PROT_READ, cudaHostRegisterReadOnly},
                        {"PROT_NONE", PROT_NONE, 0},
                        {"PROT_NONE readonly", PROT_NONE, cudaHostRegisterReadOnly},
                        {"PROT_READ|PROT_WRITE", PROT_READ | PROT_WRITE, 0}};
  for (const Step& st : steps) {
    int mp = mprotect(a, n, st.prot);
    int rr = cudaHostRegister(a, n, st.flags);
    int last = cudaGetLastError();
    std::string q = rt_queries(a);
    int ru = rr == 0 ? cudaHostUnregister(a) : -1;
    out("%s: mprotect=%d register=%d last=%d %s unregister=%d", st.name, mp, rr, last, q.c_str(),
        ru);
  }
  void* unmapped = map(n);
  munmap(unmapped, n);
  rr = cudaHostRegister(unmapped, n, 0);
  out("unmapped: register=%d last=%d", rr, cudaGetLastError());
}

// ------------------------------------------------------------------ fork ----
// Private_Dirty of the whole process in KiB (/proc/self/smaps_rollup), -1 if unknown.
long private_dirty_kb() {
  FILE* f = std::fopen("/proc/self/smaps_rollup", "r");
  if (f == nullptr) return -1;
  char line[256];
  long kb = -1;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "Private_Dirty: %ld kB", &kb) == 1) break;
  }
  std::fclose(f);
  return kb;
}

void case_fork(size_t n) {
  rt_setup(nullptr);
  void* dev = nullptr;
  CHECK(cudaMalloc(&dev, 4 * kMiB));
  unsigned char* a = static_cast<unsigned char*>(map(n));
  std::memset(a, 7, n);
  int rr = cudaHostRegister(a, n, 0);
  int c = cudaMemcpy(dev, a, 4 * kMiB, cudaMemcpyHostToDevice);
  int ru = cudaHostUnregister(a);
  out("register=%d h2d=%d unregister=%d", rr, c, ru);
  std::fflush(stdout);
  double t0 = tapp::now_us();
  pid_t pid = fork();
  if (pid == 0) {
    // Pinned pages are copied into the child at fork; shared ones are not.
    const long kb = private_dirty_kb();
    out("child holds a private copy of the buffer=%s",
        kb < 0 ? "unknown" : kb >= static_cast<long>(n / 2048) ? "yes" : "no");
    _exit(0);
  }
  double t1 = tapp::now_us();
  int status = 0;
  waitpid(pid, &status, 0);
  std::fprintf(stderr, "fork: %s registered and unregistered: fork took %.0f us\n",
               tapp::size_name(n).c_str(), t1 - t0);
  out("child exited=%d status=%d", WIFEXITED(status), WEXITSTATUS(status));
  unsigned char* check = static_cast<unsigned char*>(tapp::alloc_aligned(4 * kMiB));
  use("after the fork", a, 4 * kMiB, dev, check, 9);
  out("unregister=%d", cudaHostUnregister(a));
}

// --------------------------------------------------------------- capture ----
// Begins a global-mode capture of one launch on s, runs `other` on another
// thread, then ends the capture; prints what the program sees.
template <typename F>
void during_capture(const char* what, cudaStream_t s, F other) {
  int b = cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  spin<<<1, 1, 0, s>>>(1000);
  int l = cudaGetLastError();
  std::string seen;
  std::thread([&] { seen = other(); }).join();
  cudaGraph_t g = nullptr;
  int e = cudaStreamEndCapture(s, &g);
  int inst = -1, launch = -1, sync = -1;
  if (e == 0 && g) {
    cudaGraphExec_t x = nullptr;
    inst = cudaGraphInstantiate(&x, g, 0);
    if (inst == 0) {
      launch = cudaGraphLaunch(x, s);
      sync = cudaStreamSynchronize(s);
      cudaGraphExecDestroy(x);
    }
    cudaGraphDestroy(g);
  }
  out("%s: begin=%d launch=%d %s end=%d graph=%d instantiate=%d graph launch=%d sync=%d last=%d",
      what, b, l, seen.c_str(), e, g != nullptr, inst, launch, sync, cudaGetLastError());
}

void case_capture() {
  cudaStream_t s;
  rt_setup(&s);
  const size_t n = 4 * kMiB;
  void* a = tapp::alloc_aligned(n);
  auto code = [](const char* name, int rc) { return std::string(name) + "=" + std::to_string(rc); };
  std::string q;
  CUcontext ctx = nullptr;
  cuCtxGetCurrent(&ctx);
  out("register=%d", cudaHostRegister(a, n, 0));
  during_capture("global mode", s, [&] {
    int rc = cudaHostUnregister(a);
    cudaGetLastError();
    return code("cudaHostUnregister", rc);
  });
  q = rt_queries(a);
  out("after: %s unregister=%d", q.c_str(), cudaHostUnregister(a));
  out("register=%d", cudaHostRegister(a, n, 0));
  during_capture("driver global mode", s, [&] {
    int set = cuCtxSetCurrent(ctx);
    return code("set", set) + " " + code("cuMemHostUnregister", cuMemHostUnregister(a));
  });
  q = rt_queries(a);
  out("after: %s unregister=%d", q.c_str(), cudaHostUnregister(a));
  out("register=%d", cudaHostRegister(a, n, 0));
  during_capture("relaxed mode", s, [&] {
    cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
    int x = cudaThreadExchangeStreamCaptureMode(&m);
    int rc = cudaHostUnregister(a);
    cudaGetLastError();
    return code("exchange", x) + " " + code("cudaHostUnregister", rc);
  });
  out("after: %s", rt_queries(a).c_str());
  during_capture("relaxed mode synchronize", s, [&] {
    cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
    int x = cudaThreadExchangeStreamCaptureMode(&m);
    int rc = cudaDeviceSynchronize();
    cudaGetLastError();
    return code("exchange", x) + " " + code("cudaDeviceSynchronize", rc);
  });
}

// A pointer an answer holds, named as it relates to the buffer (raw
// pointers are never printed).
std::string which(uintptr_t v, const void* base, size_t n) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(base);
  if (v == 0) return "null";
  if (v == 0x5a5a5a5a5a5a5a5aull) return "untouched";
  if (v >= b && v < b + n) return "buf+" + std::to_string(v - b);
  return "other";
}

void case_queries() {
  const size_t n = 4 * kMiB;
  char* a = static_cast<char*>(std::aligned_alloc(4096, n));
  void* dev = nullptr;
  if (a == nullptr || cudaMalloc(&dev, n) != cudaSuccess) std::exit(1);
  char* back = static_cast<char*>(std::malloc(n));
  void* p = a + 100;
  for (int round = 0; round < 6; ++round) {
    std::memset(a, 0x10 + round, n);
    const int r = cudaHostRegister(a, n, 0);
    const int c = cudaMemcpy(dev, a, n, cudaMemcpyHostToDevice);
    const int u = cudaHostUnregister(a);
    const int b = cudaMemcpy(back, dev, n, cudaMemcpyDeviceToHost);
    out("round %d: register=%d copy=%d unregister=%d bytes=%s", round, r, c, u,
        b == 0 && std::memcmp(back, a, n) == 0 ? "ok" : "WRONG");
    cudaPointerAttributes pa;
    std::memset(&pa, 0x5a, sizeof pa);
    const int rc = cudaPointerGetAttributes(&pa, p);
    const int last = cudaGetLastError();
    out("round %d: cudaPointerGetAttributes=%d last=%d type=%d device=%d devicePointer=%s hostPointer=%s",
        round, rc, last, static_cast<int>(pa.type), pa.device,
        which(reinterpret_cast<uintptr_t>(pa.devicePointer), a, n).c_str(),
        which(reinterpret_cast<uintptr_t>(pa.hostPointer), a, n).c_str());
    const CUpointer_attribute attrs[] = {
        CU_POINTER_ATTRIBUTE_CONTEXT,       CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        CU_POINTER_ATTRIBUTE_DEVICE_POINTER, CU_POINTER_ATTRIBUTE_HOST_POINTER,
        CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,   CU_POINTER_ATTRIBUTE_IS_MANAGED,
        CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_MAPPED,
        CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        CU_POINTER_ATTRIBUTE_ACCESS_FLAGS};
    constexpr int kAttrs = sizeof attrs / sizeof attrs[0];
    uint64_t values[kAttrs];
    void* data[kAttrs];
    std::string each;
    for (int k = 0; k < kAttrs; ++k) {
      values[k] = 0x5a5a5a5a5a5a5a5aull;
      data[k] = &values[k];
    }
    const int rcs = cuPointerGetAttributes(kAttrs, const_cast<CUpointer_attribute*>(attrs), data,
                                           reinterpret_cast<CUdeviceptr>(p));
    for (int k = 0; k < kAttrs; ++k) {
      const bool pointer = attrs[k] == CU_POINTER_ATTRIBUTE_CONTEXT ||
                           attrs[k] == CU_POINTER_ATTRIBUTE_DEVICE_POINTER ||
                           attrs[k] == CU_POINTER_ATTRIBUTE_HOST_POINTER ||
                           attrs[k] == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR;
      each += " " + std::to_string(attrs[k]) + "=" +
              (pointer ? which(values[k], a, n) : std::to_string(values[k]));
    }
    out("round %d: cuPointerGetAttributes=%d%s", round, rcs, each.c_str());
    unsigned type = 0x5a5a5a5a;
    const int one = cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                          reinterpret_cast<CUdeviceptr>(p));
    unsigned flags = 0x5a5a5a5a, dflags = 0x5a5a5a5a;
    const int hf = cudaHostGetFlags(&flags, p);
    const int hf_last = cudaGetLastError();
    const int df = cuMemHostGetFlags(&dflags, p);
    void* dp = reinterpret_cast<void*>(0x5a5a5a5a5a5a5a5aull);
    const int hd = cudaHostGetDevicePointer(&dp, p, 0);
    const int hd_last = cudaGetLastError();
    CUdeviceptr ddp = 0x5a5a5a5a5a5a5a5aull;
    const int dd = cuMemHostGetDevicePointer(&ddp, p, 0);
    out("round %d: cuPointerGetAttribute=%d type=%u cudaHostGetFlags=%d last=%d flags=%u "
        "cuMemHostGetFlags=%d flags=%u cudaHostGetDevicePointer=%d last=%d ptr=%s "
        "cuMemHostGetDevicePointer=%d ptr=%s",
        round, one, type, hf, hf_last, flags, df, dflags, hd, hd_last,
        which(reinterpret_cast<uintptr_t>(dp), a, n).c_str(), dd, which(ddp, a, n).c_str());
  }
  cudaFree(dev);
  std::free(back);
  std::free(a);
}

int run_case(const std::string& name, const tapp::Args& args) {
  tapp::current_case = name;
  if (name == "wait") case_wait();
  else if (name == "pageable") case_pageable();
  else if (name == "hostwait") case_hostwait();
  else if (name == "remap") case_remap();
  else if (name == "noctx") case_noctx();
  else if (name == "primary") case_primary();
  else if (name == "thread") case_thread();
  else if (name == "mprotect") case_mprotect();
  else if (name == "fork") case_fork(args.size("fork-bytes", 256 * kMiB));
  else if (name == "capture") case_capture();
  else if (name == "queries") case_queries();
  else args.die("unknown case " + name);
  out("done");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  tapp::Args args(argc, argv, {"case", "kernel-ms", "fork-bytes"}, {}, kUsage);
  g_cycles = static_cast<long long>(args.real("kernel-ms", 100));
  if (args.has("case")) return run_case(args.str("case", ""), args);
  // Every case in a process of its own, in order.
  for (const char* c : kCases) {
    std::string opt = std::string("--case=") + c;
    std::vector<std::string> v = {argv[0], opt};
    for (int i = 1; i < argc; ++i) v.push_back(argv[i]);
    std::vector<char*> cargv;
    for (auto& x : v) cargv.push_back(&x[0]);
    cargv.push_back(nullptr);
    std::fflush(stdout);
    pid_t pid;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, cargv.data(), environ) != 0) return 1;
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
      std::printf("%s: exited abnormally (status %d)\n", c, st);
  }
  return 0;
}
