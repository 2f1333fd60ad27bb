// probe_unregister: GPU-only probe for "the program's own
// unregister while the GPU is busy" (goal: median < 5 us in defer mode with
// LAZYPIN_UNREGISTER_WAIT=0). It times, one by one (median of many), every
// driver call and system call that lazypin's unregister path makes or might
// make, while a ~200 ms kernel runs on one stream and (optionally) another
// thread copies 64 KiB in a loop on a second stream (the stall app's
// condition), then the full unregister through each door, against the same
// with the GPU idle.
//
// Phases, in this order (the program's very first unregister is the first
// one timed in "busy"):
//   busy          kernel running, copier thread running
//   busy_nocopy   kernel running, no copier
//   idle          nothing running
//   busy2         as busy, again (steady state)
// Each phase registers --count buffers of --bytes before its kernel, then
// times: the driver calls and system calls below (--iters each), then
// cudaHostUnregister of half the buffers and cuMemHostUnregister of the other
// half, each individually (without lazypin the first of them waits for the
// kernel, and the phase is idle from there on), then both unregisters of a
// pointer that is not registered (the driver's and cudart's own cost up to
// its refusal).
//
// Output, one line per measurement:
//   probe phase=<p> what=<name> n=<n> median_ns= p90_ns= max_ns= first_ns=
//   probe phase=<p> busy_at_end=<0|1> kernel_ms=<measured>
// busy_at_end=0 in a busy phase means the kernel ended before the timings
// did: raise --kernel-ms.
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <linux/futex.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common.h"

namespace {

const char* kUsage =
    "usage: probe_unregister [--kernel-ms 200] [--count 64] [--bytes 4M] [--iters 500]\n"
    "                        [--phases busy,busy_nocopy,idle,busy2]\n"
    "Times each driver call and syscall of lazypin's unregister path, and the\n"
    "unregister itself, while a kernel runs on another stream (GPU only).\n";

#define CU_CHECK(call)                                                           \
  do {                                                                           \
    CUresult cu_err_ = (call);                                                   \
    if (cu_err_ != CUDA_SUCCESS) {                                               \
      std::fprintf(stderr, "%s:%d: %s -> %d\n", __FILE__, __LINE__, #call,       \
                   static_cast<int>(cu_err_));                                   \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)

// Spins for `ns` of the GPU's global timer (wall time, whatever the clocks).
__global__ void busy_kernel(unsigned long long ns, int* out) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
  if (out) *out = 1;
}

int64_t now_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

void report(const char* phase, const std::string& what, std::vector<double> ns) {
  if (ns.empty()) return;
  const double first = ns[0];
  tapp::Stats s = tapp::stats(ns);
  std::printf("probe phase=%s what=%s n=%zu median_ns=%.0f p90_ns=%.0f max_ns=%.0f first_ns=%.0f\n",
              phase, what.c_str(), s.n, s.median, s.p90, s.max, first);
}

// Times `fn` `iters` times, one by one.
std::vector<double> time_each(int iters, const std::function<void()>& fn) {
  std::vector<double> out;
  out.reserve(iters);
  for (int i = 0; i < iters; ++i) {
    const int64_t t0 = now_ns();
    fn();
    out.push_back(static_cast<double>(now_ns() - t0));
  }
  return out;
}

void copier(cudaStream_t s, void* dev, void* pinned, size_t bytes, std::atomic<int>* stop) {
  CHECK(cudaSetDevice(0));
  while (stop->load(std::memory_order_relaxed) == 0) {
    CHECK(cudaMemcpyAsync(dev, pinned, bytes, cudaMemcpyHostToDevice, s));
    CHECK(cudaStreamSynchronize(s));
  }
}

}  // namespace

int main(int argc, char** argv) {
  tapp::Args args(argc, argv, {"kernel-ms", "count", "bytes", "iters", "phases"}, {}, kUsage);
  const double kernel_ms = args.real("kernel-ms", 200);
  const int count = static_cast<int>(args.num("count", 64));
  const size_t bytes = args.size("bytes", 4 << 20);
  const int iters = static_cast<int>(args.num("iters", 500));
  const std::string phases = args.str("phases", "busy,busy_nocopy,idle,busy2");

  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));
  cudaStream_t s_kernel, s_copy;
  CHECK(cudaStreamCreateWithFlags(&s_kernel, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&s_copy, cudaStreamNonBlocking));
  cudaEvent_t k0, k1;
  CHECK(cudaEventCreate(&k0));
  CHECK(cudaEventCreate(&k1));
  CUevent probe_event;
  CU_CHECK(cuEventCreate(&probe_event, CU_EVENT_DISABLE_TIMING));
  const size_t copy_bytes = 64 << 10;
  void *pinned = nullptr, *dev_copy = nullptr;
  int* dev_out = nullptr;
  CHECK(cudaMallocHost(&pinned, copy_bytes));
  std::memset(pinned, 7, copy_bytes);
  CHECK(cudaMalloc(&dev_copy, copy_bytes));
  CHECK(cudaMalloc(&dev_out, sizeof(int)));
  std::vector<void*> bufs(count);
  for (auto& b : bufs) {
    b = tapp::alloc_aligned(bytes);
    std::memset(b, 1, bytes);
  }
  void* never_registered = tapp::alloc_aligned(1 << 20);
  std::memset(never_registered, 2, 1 << 20);
  CUcontext ctx = nullptr;
  CU_CHECK(cuCtxGetCurrent(&ctx));
  CUdevice device = 0;
  CU_CHECK(cuCtxGetDevice(&device));
  const int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  std::mutex mu;
  std::atomic<uint32_t> futex_word{0};

  auto run_phase = [&](const char* name, bool busy, bool copy) {
    for (void* b : bufs) CHECK(cudaHostRegister(b, bytes, 0));
    CHECK(cudaDeviceSynchronize());
    std::atomic<int> stop{0};
    std::thread b;
    if (busy) {
      CHECK(cudaEventRecord(k0, s_kernel));
      busy_kernel<<<1, 1, 0, s_kernel>>>(static_cast<unsigned long long>(kernel_ms * 1e6), dev_out);
      CHECK_LAUNCH();
      CHECK(cudaEventRecord(k1, s_kernel));
      if (copy) b = std::thread(copier, s_copy, dev_copy, pinned, copy_bytes, &stop);
      // Let the kernel start and the copier get going.
      const int64_t until = now_ns() + 5000000;
      while (now_ns() < until) {
      }
    }
    // Each driver call lazypin's path makes (or could make instead).
    report(name, "cuCtxGetCurrent", time_each(iters, [&] {
             CUcontext c;
             cuCtxGetCurrent(&c);
           }));
    report(name, "cuCtxGetDevice", time_each(iters, [&] {
             CUdevice d;
             cuCtxGetDevice(&d);
           }));
    report(name, "cuThreadExchangeStreamCaptureMode_x2", time_each(iters, [&] {
             CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
             cuThreadExchangeStreamCaptureMode(&m);
             cuThreadExchangeStreamCaptureMode(&m);
           }));
    report(name, "cuStreamIsCapturing", time_each(iters, [&] {
             CUstreamCaptureStatus st;
             cuStreamIsCapturing(reinterpret_cast<CUstream>(s_copy), &st);
           }));
    report(name, "cuDevicePrimaryCtxGetState", time_each(iters, [&] {
             unsigned flags;
             int active;
             cuDevicePrimaryCtxGetState(device, &flags, &active);
           }));
    report(name, "cuCtxPushCurrent+Pop", time_each(iters, [&] {
             CUcontext popped;
             cuCtxPushCurrent(ctx);
             cuCtxPopCurrent(&popped);
           }));
    report(name, "cuDriverGetVersion", time_each(iters, [&] {
             int v;
             cuDriverGetVersion(&v);
           }));
    report(name, "cuStreamQuery_kernel_stream", time_each(iters, [&] {
             cuStreamQuery(reinterpret_cast<CUstream>(s_kernel));
           }));
    report(name, "cuEventRecord+Query_kernel_stream", time_each(iters / 5, [&] {
             cuEventRecord(probe_event, reinterpret_cast<CUstream>(s_kernel));
             cuEventQuery(probe_event);
           }));
    report(name, "cuCtxGetId", time_each(iters, [&] {
             unsigned long long id;
             cuCtxGetId(ctx, &id);
           }));
    report(name, "cuPointerGetAttribute_host", time_each(iters, [&] {
             CUcontext c;
             cuPointerGetAttribute(&c, CU_POINTER_ATTRIBUTE_CONTEXT,
                                   reinterpret_cast<CUdeviceptr>(never_registered));
           }));
    // System calls and library calls on the path.
    report(name, "clock_gettime", time_each(iters, [&] { (void)now_ns(); }));
    report(name, "pthread_sigmask_x2", time_each(iters, [&] {
             sigset_t all, old;
             sigfillset(&all);
             pthread_sigmask(SIG_BLOCK, &all, &old);
             pthread_sigmask(SIG_SETMASK, &old, nullptr);
           }));
    report(name, "read_nonblocking_eventfd", time_each(iters, [&] {
             uint64_t v;
             (void)!read(efd, &v, sizeof v);
           }));
    report(name, "futex_wake_nowaiter", time_each(iters, [&] {
             syscall(SYS_futex, &futex_word, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
           }));
    report(name, "mutex_lock_unlock", time_each(iters, [&] {
             mu.lock();
             mu.unlock();
           }));
    report(name, "getpid", time_each(iters, [&] { (void)syscall(SYS_getpid); }));
    report(name, "dlsym_cuCtxGetCurrent", time_each(iters / 5, [&] {
             (void)dlsym(RTLD_DEFAULT, "cuCtxGetCurrent");
           }));
    // The full unregisters, after the driver calls (bare, the first one waits
    // for the kernel): the program's first unregister ever is the first one
    // timed here.
    const bool busy_before = busy && cudaEventQuery(k1) == cudaErrorNotReady;
    const int half = count / 2;
    std::vector<double> rt, drv;
    for (int i = 0; i < half; ++i) {
      const int64_t t0 = now_ns();
      CHECK(cudaHostUnregister(bufs[i]));
      rt.push_back(static_cast<double>(now_ns() - t0));
    }
    for (int i = half; i < count; ++i) {
      const int64_t t0 = now_ns();
      CU_CHECK(cuMemHostUnregister(bufs[i]));
      drv.push_back(static_cast<double>(now_ns() - t0));
    }
    report(name, "cudaHostUnregister", rt);
    report(name, "cuMemHostUnregister", drv);
    const bool busy_after = busy && cudaEventQuery(k1) == cudaErrorNotReady;
    // The driver's and cudart's refusal of memory that is not registered:
    // their own cost up to the driver's check.
    report(name, "cuMemHostUnregister_notregistered", time_each(iters / 5, [&] {
             (void)cuMemHostUnregister(never_registered);
           }));
    report(name, "cudaHostUnregister_notregistered", time_each(iters / 5, [&] {
             (void)cudaHostUnregister(never_registered);
             (void)cudaGetLastError();
           }));
    const bool still_busy = busy && cudaEventQuery(k1) == cudaErrorNotReady;
    (void)cudaGetLastError();
    std::printf("probe phase=%s busy_before_unregisters=%d busy_after_unregisters=%d\n", name,
                busy_before ? 1 : 0, busy_after ? 1 : 0);
    stop.store(1);
    if (b.joinable()) b.join();
    CHECK(cudaDeviceSynchronize());
    float ms = 0;
    if (busy) CHECK(cudaEventElapsedTime(&ms, k0, k1));
    std::printf("probe phase=%s busy_at_end=%d kernel_ms=%.1f\n", name, still_busy ? 1 : 0, ms);
    std::fflush(stdout);
  };

  for (const char* p : {"busy", "busy_nocopy", "idle", "busy2"}) {
    if (("," + phases + ",").find(std::string(",") + p + ",") == std::string::npos) continue;
    const std::string n = p;
    run_phase(p, n != "idle", n == "busy" || n == "busy2");
  }
  std::printf("RESULT app=probe_unregister count=%d bytes=%zu iters=%d\n", count, bytes, iters);
  return 0;
}
