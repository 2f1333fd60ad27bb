// multigpu.cu: several devices in one process, through every door lazypin
// watches. A plain CUDA program: what it prints (stdout) is what it can
// observe, deterministic, and must be the same with and without lazypin.
//
// Cases (all by default, in this order, in one process):
//   threads   one thread per device, each registering its own buffer (every
//             other device PORTABLE) and copying through it, --rounds times
//   portable  a PORTABLE registration copied by every device behind a spin
//             kernel, then unregistered on device 0 and overwritten: every
//             device must have got the bytes of before the unregister (its
//             implicit wait covers every device); a registration that is not
//             PORTABLE, copied by another device (pageable there)
//   freehost  cudaFreeHost on device 0 while device 1 still copies from the
//             block (PORTABLE; then cudaMallocHost), then an allocation of the
//             same size, filled at once: device 1 must have got the old bytes;
//             the same from device 1 to device 0
//   regs      per-device registrations of one buffer: codes (712 from the
//             other device), flags and pointer attributes seen from each
//             device, PORTABLE ones
//   reset     state kept on devices 0 and 1 and in a context made with
//             cuCtxCreate on device 0; cudaDeviceReset of device 1, then of
//             device 0: what each device and that context still hold
//   peer      cudaDeviceCanAccessPeer, cudaDeviceEnablePeerAccess (twice),
//             cudaMemcpyPeer and cudaMemcpyPeerAsync, verified
//   pageable  one malloc'ed (pageable) buffer copied to every device in
//             turn, async behind a spin kernel, and overwritten right after
//             each call: every device must get the bytes of the call
//             (LAZYPIN_AUTOPIN pins it for the first device's context; the
//             others' copies of it must still behave as pageable ones)
//   idle      a buffer registered, copied and unregistered on device 0, then
//             device 1 busy with a spin kernel while the program sleeps twice
//             --kernel-ms (lazypin's idle release of the buffer comes then:
//             it must wait for device 1 first, not stall it)
//   made      the last device's primary context reset (inactive), then a
//             context made there with cuCtxCreate, which registers a buffer of
//             its own, copies from a PORTABLE buffer of device 0 behind spin
//             kernels; device 0 unregisters that buffer and overwrites it: the
//             made context's copy must have got the old bytes (runs last but
//             one: the last device's streams and buffers are gone after it)
//   unseen    (only with --case unseen) the same with no registration in the
//             made context: lazypin never sees that context (a known limit:
//             docs/design.md)
//   driver    the driver API on device 1's primary context (cuCtxSetCurrent):
//             cuCtxGetDevice, cuMemHostRegister_v2 / cuMemHostUnregister twice
//
// --bench (real GPUs; timings, not for diffing): per-device register and
// unregister cost with 1..N devices' contexts active (unified addressing:
// every active device maps a registration), PORTABLE and not; and the worst
// 64 KiB copy on devices 1..N-1 while device 0 registers, copies and
// unregisters (a release stalls every device's work). RESULT lines on stdout.
//
// CLI: multigpu [--devices N] [--case NAME] [--bytes 4M] [--rounds 3]
//               [--kernel-ms 50] [--bench] [--iters 20] [--sizes 64K,4M,64M]
// On the simulator a launch lasts SIMCUDA_KERNEL_US whatever --kernel-ms says.
// Exit: 0; 2 when fewer than 2 devices are there (nothing to show); 1 on a
// setup failure.
#include "common.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <stdarg.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

namespace {

const char* kUsage =
    "usage: multigpu [--devices N] [--case NAME] [--bytes 4M] [--rounds 3] [--kernel-ms 50]\n"
    "                [--bench] [--iters 20] [--sizes 64K,4M,64M]\n";

int g_devices = 0;
size_t g_bytes = 0;
int g_rounds = 3;
double g_kernel_ms = 50;
std::vector<cudaStream_t> g_stream;  // one non-blocking stream per device
std::vector<void*> g_dbuf;           // g_bytes of device memory per device
std::vector<long long> g_cycles;     // spin length per device

__global__ void spin(long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

// Two calls made in order, their codes printed (arguments of one call are
// evaluated in no fixed order).
#define OUT2(fmt, a, b)      \
  do {                       \
    const int a_ = (a);      \
    const int b_ = (b);      \
    out(fmt, a_, b_);        \
  } while (0)

using tapp::out;

void spin_on(int dev) {
  spin<<<1, 1, 0, g_stream[dev]>>>(g_cycles[dev]);
  CHECK(cudaGetLastError());
}

unsigned char* host_buffer(size_t n) { return static_cast<unsigned char*>(tapp::alloc_aligned(n)); }

void fill(void* p, size_t n, unsigned seed) {
  unsigned char* b = static_cast<unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>(seed * 131 + i * 7 + (i >> 12));
}

bool same(const void* p, size_t n, unsigned seed) {
  std::vector<unsigned char> ref(n);
  fill(ref.data(), n, seed);
  return std::memcmp(p, ref.data(), n) == 0;
}

bool zero(const void* p, size_t n) {
  const unsigned char* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i)
    if (b[i] != 0) return false;
  return true;
}

// What device `dev`'s buffer holds: the bytes of `seed`, of `later`, or other.
const char* device_holds(int dev, unsigned seed, unsigned later) {
  std::vector<unsigned char> back(g_bytes);
  CHECK(cudaSetDevice(dev));
  CHECK(cudaStreamSynchronize(g_stream[dev]));
  CHECK(cudaMemcpy(back.data(), g_dbuf[dev], g_bytes, cudaMemcpyDeviceToHost));
  if (same(back.data(), g_bytes, seed)) return "bytes-of-the-copy";
  if (same(back.data(), g_bytes, later)) return "later-bytes";
  return zero(back.data(), g_bytes) ? "zeros" : "other-bytes";
}

// ---------------------------------------------------------------- threads ----
void case_threads() {
  std::vector<std::string> lines(g_devices);
  std::vector<std::thread> threads;
  for (int d = 0; d < g_devices; ++d) {
    threads.emplace_back([d, &lines] {
      CHECK(cudaSetDevice(d));
      unsigned char* h = host_buffer(g_bytes);
      std::vector<unsigned char> back(g_bytes);
      const unsigned flags = d % 2 ? cudaHostRegisterPortable : cudaHostRegisterDefault;
      std::string line = "device " + std::to_string(d) + (flags ? " portable" : " default");
      for (int r = 0; r < g_rounds; ++r) {
        fill(h, g_bytes, 100 * d + r);
        const int reg = cudaHostRegister(h, g_bytes, flags);
        CHECK(cudaMemcpyAsync(g_dbuf[d], h, g_bytes, cudaMemcpyHostToDevice, g_stream[d]));
        CHECK(cudaMemcpyAsync(back.data(), g_dbuf[d], g_bytes, cudaMemcpyDeviceToHost, g_stream[d]));
        CHECK(cudaStreamSynchronize(g_stream[d]));
        const bool ok = std::memcmp(back.data(), h, g_bytes) == 0;
        const int unreg = cudaHostUnregister(h);
        int dev = -1;
        CHECK(cudaGetDevice(&dev));
        line += " | register=" + std::to_string(reg) + " copy=" + (ok ? "ok" : "WRONG") +
                " unregister=" + std::to_string(unreg) + " on=" + std::to_string(dev);
      }
      lines[d] = line;
      std::free(h);
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& l : lines) out("%s", l.c_str());
}

int on(int dev) {
  CHECK(cudaSetDevice(dev));
  return dev;
}

// --------------------------------------------------------------- portable ----
void case_portable() {
  for (unsigned flags : {unsigned{cudaHostRegisterPortable}, unsigned{cudaHostRegisterDefault}}) {
    const char* name = flags ? "portable" : "default";
    unsigned char* h = host_buffer(g_bytes);
    fill(h, g_bytes, 7);
    CHECK(cudaSetDevice(0));
    const int reg = cudaHostRegister(h, g_bytes, flags);
    // Every device copies from it behind spin kernels, device d behind d + 1
    // of them: still in flight, the other devices' after device 0's.
    for (int d = 0; d < g_devices; ++d) {
      CHECK(cudaSetDevice(d));
      for (int k = 0; k <= d; ++k) spin_on(d);
      CHECK(cudaMemcpyAsync(g_dbuf[d], h, g_bytes, cudaMemcpyHostToDevice, g_stream[d]));
    }
    CHECK(cudaSetDevice(0));
    const int unreg = cudaHostUnregister(h);
    fill(h, g_bytes, 8);  // the program believes every copy done
    std::string line = std::string(name) + " register=" + std::to_string(reg) +
                       " unregister=" + std::to_string(unreg);
    for (int d = 0; d < g_devices; ++d)
      line += std::string(" dev") + std::to_string(d) + "=" + device_holds(d, 7, 8);
    out("%s", line.c_str());
    // Registered again (a pool hit with lazypin) and copied by the last device.
    CHECK(cudaSetDevice(0));
    fill(h, g_bytes, 9);
    const int again = cudaHostRegister(h, g_bytes, flags);
    const int last = g_devices - 1;
    CHECK(cudaSetDevice(last));
    CHECK(cudaMemcpyAsync(g_dbuf[last], h, g_bytes, cudaMemcpyHostToDevice, g_stream[last]));
    const char* holds = device_holds(last, 9, 8);
    on(0);
    const int unreg2 = cudaHostUnregister(h);
    out("%s again register=%d dev%d=%s unregister=%d", name, again, last, holds, unreg2);
    std::free(h);
  }
}

// --------------------------------------------------------------- freehost ----
// A pinned block freed on `owner` while `reader` still copies from it.
void free_while_copying(int owner, int reader, bool portable) {
  void* b = nullptr;
  CHECK(cudaSetDevice(owner));
  const int alloc = portable ? cudaHostAlloc(&b, g_bytes, cudaHostAllocPortable) : cudaMallocHost(&b, g_bytes);
  if (alloc != 0) {
    out("owner %d reader %d %s alloc=%d", owner, reader, portable ? "portable" : "mallochost", alloc);
    return;
  }
  fill(b, g_bytes, 21);
  CHECK(cudaSetDevice(reader));
  spin_on(reader);
  CHECK(cudaMemcpyAsync(g_dbuf[reader], b, g_bytes, cudaMemcpyHostToDevice, g_stream[reader]));
  CHECK(cudaSetDevice(owner));
  const int freed = cudaFreeHost(b);
  void* again = nullptr;
  const int alloc2 =
      portable ? cudaHostAlloc(&again, g_bytes, cudaHostAllocPortable) : cudaMallocHost(&again, g_bytes);
  const bool fresh = alloc2 == 0 && zero(again, g_bytes);
  if (alloc2 == 0) fill(again, g_bytes, 22);  // at once: the old block may be this one
  out("owner %d reader %d %s free=%d alloc=%d fresh=%s reader-got=%s", owner, reader,
      portable ? "portable" : "mallochost", freed, alloc2, fresh ? "zeros" : "NOT-ZERO",
      device_holds(reader, 21, 22));
  CHECK(cudaSetDevice(owner));
  if (alloc2 == 0) {
    const int freed2 = cudaFreeHost(again);
    out("free again=%d", freed2);
  }
}

void case_freehost() {
  free_while_copying(0, 1, true);
  free_while_copying(0, 1, false);
  free_while_copying(1, 0, true);
  free_while_copying(g_devices - 1, 0, true);
}

// ------------------------------------------------------------------- regs ----
std::string attrs(void* p) {
  cudaPointerAttributes a;
  std::memset(&a, 0, sizeof a);
  const int rc = cudaPointerGetAttributes(&a, p);
  unsigned f = 0;
  const int gf = cudaHostGetFlags(&f, p);
  cudaGetLastError();
  char b[120];
  std::snprintf(b, sizeof b, "ptrattr=%d type=%d device=%d getflags=%d flags=%u", rc,
                rc == 0 ? static_cast<int>(a.type) : -1, rc == 0 ? a.device : -9, gf, gf == 0 ? f : 0);
  return b;
}

void case_regs() {
  unsigned char* x = host_buffer(g_bytes);
  fill(x, g_bytes, 31);
  on(0);
  out("dev0 register=%d", cudaHostRegister(x, g_bytes, 0));
  on(1);
  out("dev1 register=%d (registered on dev0)", cudaHostRegister(x, g_bytes, 0));
  out("dev1 sees %s", attrs(x).c_str());
  on(0);
  out("dev0 unregister=%d", cudaHostUnregister(x));
  on(1);
  out("dev1 register=%d", cudaHostRegister(x, g_bytes, 0));
  out("dev1 sees %s", attrs(x).c_str());
  out("dev1 unregister=%d", cudaHostUnregister(x));
  on(0);
  out("dev0 register=%d", cudaHostRegister(x, g_bytes, 0));
  out("dev0 unregister=%d", cudaHostUnregister(x));
  out("dev0 unregister again=%d", cudaHostUnregister(x));
  cudaGetLastError();
  // PORTABLE: made on one device, visible to all.
  for (int round = 0; round < 2; ++round) {
    for (int d = 0; d < g_devices; ++d) {
      on(d);
      const int reg = cudaHostRegister(x, g_bytes, cudaHostRegisterPortable);
      std::string seen;
      for (int e = 0; e < g_devices; ++e) {
        on(e);
        seen += " dev" + std::to_string(e) + ": " + attrs(x);
      }
      on(d);
      const int unreg = cudaHostUnregister(x);
      out("round %d portable on dev%d register=%d%s unregister=%d", round, d, reg, seen.c_str(), unreg);
    }
  }
  std::free(x);
}

// ------------------------------------------------------------------ reset ----
void case_reset() {
  const size_t small = 1 << 20;
  unsigned char* w = host_buffer(g_bytes);  // device 0
  unsigned char* y = host_buffer(g_bytes);  // device 1
  unsigned char* u = host_buffer(g_bytes);  // a context made on device 0
  fill(w, g_bytes, 41);
  fill(y, g_bytes, 42);
  fill(u, g_bytes, 43);
  on(0);
  OUT2("dev0 register=%d unregister=%d", cudaHostRegister(w, g_bytes, 0), cudaHostUnregister(w));
  void* v = nullptr;
  OUT2("dev0 hostalloc=%d freehost=%d", cudaMallocHost(&v, small), cudaFreeHost(v));
  on(1);
  OUT2("dev1 register=%d unregister=%d", cudaHostRegister(y, g_bytes, 0), cudaHostUnregister(y));
  void* z = nullptr;
  OUT2("dev1 hostalloc=%d freehost=%d", cudaMallocHost(&z, small), cudaFreeHost(z));
  // A context of its own on device 0 (driver API).
  CUcontext made = nullptr;
  out("cuCtxCreate dev0=%d", cuCtxCreate(&made, nullptr, 0, 0));
  OUT2("made register=%d unregister=%d", cuMemHostRegister(u, g_bytes, 0), cuMemHostUnregister(u));
  void* m = nullptr;
  OUT2("made hostalloc=%d freehost=%d", cuMemAllocHost(&m, small), cuMemFreeHost(m));
  CUcontext popped = nullptr;
  out("pop=%d", cuCtxPopCurrent(&popped));

  on(1);
  out("dev1 reset=%d", cudaDeviceReset());
  on(1);
  out("dev1 unregister after reset=%d", cudaHostUnregister(y));
  cudaGetLastError();
  on(0);
  const int reg = cudaHostRegister(w, g_bytes, 0);
  CHECK(cudaMemcpy(g_dbuf[0], w, g_bytes, cudaMemcpyHostToDevice));
  const char* holds = device_holds(0, 41, 0);
  const int unreg = cudaHostUnregister(w);
  out("dev0 register=%d dev0=%s unregister=%d", reg, holds, unreg);
  void* v2 = nullptr;
  const int a0 = cudaMallocHost(&v2, small);
  const bool z0 = a0 == 0 && zero(v2, small);
  const int f0 = cudaFreeHost(v2);
  out("dev0 hostalloc=%d zeroed=%d freehost=%d", a0, z0, f0);
  on(1);
  void* z2 = nullptr;
  const int a1 = cudaMallocHost(&z2, small);
  const bool zz = a1 == 0 && zero(z2, small);
  const int f1 = cudaFreeHost(z2);
  out("dev1 hostalloc=%d zeroed=%d freehost=%d", a1, zz, f1);
  OUT2("dev1 register=%d unregister=%d", cudaHostRegister(y, g_bytes, 0), cudaHostUnregister(y));

  // Device 0's primary reset leaves the context made on device 0.
  on(0);
  out("dev0 reset=%d", cudaDeviceReset());
  out("push made=%d", cuCtxPushCurrent(made));
  OUT2("made register=%d unregister=%d", cuMemHostRegister(u, g_bytes, 0), cuMemHostUnregister(u));
  void* m2 = nullptr;
  const int am = cuMemAllocHost(&m2, small);
  const bool zm = am == 0 && zero(m2, small);
  const int fm = cuMemFreeHost(m2);
  out("made hostalloc=%d zeroed=%d freehost=%d", am, zm, fm);
  out("destroy made=%d", cuCtxDestroy(made));
  on(0);
  OUT2("dev0 register=%d unregister=%d", cudaHostRegister(w, g_bytes, 0), cudaHostUnregister(w));
  std::free(w);
  std::free(y);
  std::free(u);
}

// ------------------------------------------------------------------- peer ----
void case_peer() {
  int can = -1;
  int rc = cudaDeviceCanAccessPeer(&can, 0, 1);
  out("canAccessPeer 0->1=%d value=%d", rc, can);
  rc = cudaDeviceCanAccessPeer(&can, 0, 0);
  out("canAccessPeer 0->0=%d value=%d", rc, can);
  on(0);
  out("enablePeerAccess 1=%d", cudaDeviceEnablePeerAccess(1, 0));
  out("enablePeerAccess 1 again=%d", cudaDeviceEnablePeerAccess(1, 0));
  cudaGetLastError();
  unsigned char* h = host_buffer(g_bytes);
  fill(h, g_bytes, 51);
  CHECK(cudaMemcpy(g_dbuf[0], h, g_bytes, cudaMemcpyHostToDevice));
  rc = cudaMemcpyPeer(g_dbuf[1], 1, g_dbuf[0], 0, g_bytes);
  out("memcpyPeer 0->1=%d dev1=%s", rc, device_holds(1, 51, 0));
  fill(h, g_bytes, 52);
  on(1);
  CHECK(cudaMemcpy(g_dbuf[1], h, g_bytes, cudaMemcpyHostToDevice));
  on(0);
  rc = cudaMemcpyPeerAsync(g_dbuf[0], 0, g_dbuf[1], 1, g_bytes, g_stream[0]);
  out("memcpyPeerAsync 1->0=%d dev0=%s", rc, device_holds(0, 52, 0));
  on(0);
  out("disablePeerAccess 1=%d", cudaDeviceDisablePeerAccess(1));
  std::free(h);
}

// --------------------------------------------------------------- pageable ----
void case_pageable() {
  unsigned char* h = host_buffer(g_bytes);
  for (int round = 0; round < 2; ++round) {
    std::string line = "round " + std::to_string(round);
    for (int d = 0; d < g_devices; ++d) {
      const unsigned seed = 60 + 10 * round + d;
      fill(h, g_bytes, seed);
      on(d);
      spin_on(d);
      CHECK(cudaMemcpyAsync(g_dbuf[d], h, g_bytes, cudaMemcpyHostToDevice, g_stream[d]));
      fill(h, g_bytes, 99);  // a pageable copy took the bytes of the call
      line += std::string(" dev") + std::to_string(d) + "=" + device_holds(d, seed, 99);
      // And back into the pageable buffer: complete when the call returns.
      on(d);
      spin_on(d);
      CHECK(cudaMemcpyAsync(h, g_dbuf[d], g_bytes, cudaMemcpyDeviceToHost, g_stream[d]));
      line += same(h, g_bytes, seed) ? ",back" : ",NOT-BACK";
      CHECK(cudaStreamSynchronize(g_stream[d]));
    }
    out("%s", line.c_str());
  }
  std::free(h);
}

// ------------------------------------------------------------------- idle ----
void case_idle() {
  unsigned char* h = host_buffer(g_bytes);
  fill(h, g_bytes, 71);
  on(0);
  const int reg = cudaHostRegister(h, g_bytes, 0);
  CHECK(cudaMemcpy(g_dbuf[0], h, g_bytes, cudaMemcpyHostToDevice));
  const int unreg = cudaHostUnregister(h);
  on(1);
  spin_on(1);
  usleep(static_cast<useconds_t>(2000 * g_kernel_ms));
  CHECK(cudaStreamSynchronize(g_stream[1]));
  out("register=%d unregister=%d dev0=%s", reg, unreg, device_holds(0, 71, 0));
  std::free(h);
}

// ------------------------------------------------------------- made/unseen ----
void made_context(bool seen) {
  const int dev = g_devices - 1;
  on(dev);
  CHECK(cudaDeviceReset());  // no active primary context on that device
  unsigned char* p = host_buffer(g_bytes);
  unsigned char* own = host_buffer(g_bytes);
  fill(p, g_bytes, 81);
  on(0);
  const int reg = cudaHostRegister(p, g_bytes, cudaHostRegisterPortable);
  CUcontext made = nullptr;
  CHECK(static_cast<cudaError_t>(cuCtxCreate(&made, nullptr, 0, dev)));
  if (seen) {
    const int r = cuMemHostRegister(own, g_bytes, 0);
    const int u = cuMemHostUnregister(own);
    out("made register=%d unregister=%d", r, u);
  }
  CUstream s = nullptr;
  CUdeviceptr d = 0;
  CHECK(static_cast<cudaError_t>(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING)));
  CHECK(static_cast<cudaError_t>(cuMemAlloc(&d, g_bytes)));
  // Behind two spin kernels: in flight well after device 0's work.
  for (int k = 0; k < 2; ++k) {
    spin<<<1, 1, 0, reinterpret_cast<cudaStream_t>(s)>>>(g_cycles[dev]);
    CHECK(cudaGetLastError());
  }
  CHECK(static_cast<cudaError_t>(cuMemcpyHtoDAsync(d, p, g_bytes, s)));
  CUcontext popped = nullptr;
  CHECK(static_cast<cudaError_t>(cuCtxPopCurrent(&popped)));
  on(0);
  const int unreg = cudaHostUnregister(p);
  fill(p, g_bytes, 82);
  CHECK(static_cast<cudaError_t>(cuCtxPushCurrent(made)));
  CHECK(static_cast<cudaError_t>(cuStreamSynchronize(s)));
  std::vector<unsigned char> back(g_bytes);
  CHECK(static_cast<cudaError_t>(cuMemcpyDtoH(back.data(), d, g_bytes)));
  const char* got = same(back.data(), g_bytes, 81)   ? "bytes-of-the-copy"
                    : same(back.data(), g_bytes, 82) ? "later-bytes"
                                                     : "other-bytes";
  out("portable register=%d unregister=%d made-context-got=%s", reg, unreg, got);
  CHECK(static_cast<cudaError_t>(cuCtxDestroy(made)));
  on(0);
  std::free(p);
  std::free(own);
}

void case_made() { made_context(true); }
void case_unseen() { made_context(false); }

// ----------------------------------------------------------------- driver ----
void case_driver() {
  const int dev = g_devices - 1;
  CUcontext primary = nullptr;
  out("retain dev%d=%d", dev, cuDevicePrimaryCtxRetain(&primary, dev));
  out("setCurrent=%d", cuCtxSetCurrent(primary));
  CUdevice got = -1;
  const int rc = cuCtxGetDevice(&got);
  out("getDevice=%d device=%d", rc, got);
  int rt_dev = -1;
  CHECK(cudaGetDevice(&rt_dev));
  out("cudaGetDevice=%d", rt_dev);
  unsigned char* h = host_buffer(g_bytes);
  for (int r = 0; r < 2; ++r) {
    const int reg = cuMemHostRegister(h, g_bytes, CU_MEMHOSTREGISTER_PORTABLE);
    const int unreg = cuMemHostUnregister(h);
    out("round %d register=%d unregister=%d", r, reg, unreg);
  }
  out("release=%d", cuDevicePrimaryCtxRelease(dev));
  on(0);  // the runtime's device 0 current again
  CHECK(cudaGetDevice(&rt_dev));
  out("cudaGetDevice=%d", rt_dev);
  std::free(h);
}

// ------------------------------------------------------------------ bench ----
struct Cost {
  double reg, unreg;
};

Cost pin_cost(int dev, size_t n, unsigned flags, int iters) {
  CHECK(cudaSetDevice(dev));
  unsigned char* h = host_buffer(n);
  std::memset(h, 1, n);
  std::vector<double> r, u;
  for (int i = 0; i < iters; ++i) {
    double t0 = tapp::now_us();
    CHECK(cudaHostRegister(h, n, flags));
    double t1 = tapp::now_us();
    CHECK(cudaHostUnregister(h));
    double t2 = tapp::now_us();
    r.push_back(t1 - t0);
    u.push_back(t2 - t1);
  }
  std::free(h);
  return {tapp::stats(r).median, tapp::stats(u).median};
}

void bench(const tapp::Args& args) {
  const int iters = static_cast<int>(args.num("iters", 20));
  const std::vector<size_t> sizes = args.sizes("sizes", "64K,4M,64M");
  // 1) Cost of pinning with 1..N devices' primary contexts active.
  for (int active = 1; active <= g_devices; ++active) {
    for (int d = 0; d < active; ++d) CHECK((cudaSetDevice(d), cudaFree(nullptr)));
    for (size_t n : sizes) {
      for (unsigned flags : {unsigned{cudaHostRegisterDefault}, unsigned{cudaHostRegisterPortable}}) {
        Cost c = pin_cost(0, n, flags, iters);
        std::printf("RESULT pin active_devices=%d bytes=%zu flags=%u register_us=%.1f unregister_us=%.1f\n",
                    active, n, flags, c.reg, c.unreg);
      }
    }
  }
  // 2) Other devices' 64 KiB copies while device 0 registers, copies and unregisters.
  std::atomic<bool> stop{false};
  std::vector<std::thread> traffic;
  std::vector<double> worst(g_devices, 0), base(g_devices, 0);
  auto copies = [&](int d, double* w) {
    CHECK(cudaSetDevice(d));
    void* h = nullptr;
    CHECK(cudaMallocHost(&h, 64 << 10));
    while (!stop.load()) {
      double t0 = tapp::now_us();
      CHECK(cudaMemcpyAsync(g_dbuf[d], h, 64 << 10, cudaMemcpyHostToDevice, g_stream[d]));
      CHECK(cudaStreamSynchronize(g_stream[d]));
      *w = std::max(*w, tapp::now_us() - t0);
    }
    CHECK(cudaFreeHost(h));
  };
  for (int pass = 0; pass < 2; ++pass) {
    stop = false;
    traffic.clear();
    for (int d = 1; d < g_devices; ++d) traffic.emplace_back(copies, d, pass ? &worst[d] : &base[d]);
    CHECK(cudaSetDevice(0));
    const size_t n = sizes.back();
    unsigned char* h = host_buffer(n);
    std::memset(h, 2, n);
    for (int i = 0; i < iters; ++i) {
      if (pass) {
        spin_on(0);
        CHECK(cudaHostRegister(h, n, 0));
        CHECK(cudaMemcpyAsync(g_dbuf[0], h, std::min(n, g_bytes), cudaMemcpyHostToDevice, g_stream[0]));
        CHECK(cudaHostUnregister(h));
      } else {
        usleep(2000);
      }
    }
    stop = true;
    for (auto& t : traffic) t.join();
    std::free(h);
  }
  for (int d = 1; d < g_devices; ++d)
    std::printf("RESULT traffic device=%d worst_copy_us_idle=%.1f worst_copy_us_during_unregisters=%.1f\n",
                d, base[d], worst[d]);
}

}  // namespace

int main(int argc, char** argv) {
  tapp::Args args(argc, argv, {"devices", "case", "bytes", "rounds", "kernel-ms", "iters", "sizes"},
                  {"bench"}, kUsage);
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  g_devices = std::min<int>(static_cast<int>(args.num("devices", count)), count);
  if (g_devices < 2) {
    std::fprintf(stderr, "multigpu: %d device(s) here, 2 or more needed\n", count);
    return 2;
  }
  g_bytes = args.size("bytes", 4 << 20);
  g_rounds = static_cast<int>(args.num("rounds", 3));
  g_kernel_ms = args.real("kernel-ms", 50);
  const std::string only = args.str("case", "");
  std::printf("devices %d\n", g_devices);
  for (int d = 0; d < g_devices; ++d) {
    CHECK(cudaSetDevice(d));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    g_stream.push_back(s);
    void* p = nullptr;
    CHECK(cudaMalloc(&p, g_bytes));
    g_dbuf.push_back(p);
    int khz = 0;
    CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, d));
    g_cycles.push_back(static_cast<long long>(g_kernel_ms * khz));
  }
  if (args.has("bench")) {
    bench(args);
    return 0;
  }
  struct Case {
    const char* name;
    void (*run)();
  };
  // reset last but one: it resets devices 0 and 1 (their streams and buffers go).
  const Case cases[] = {{"threads", case_threads}, {"portable", case_portable},
                        {"freehost", case_freehost}, {"regs", case_regs},
                        {"peer", case_peer},         {"pageable", case_pageable},
                        {"idle", case_idle},         {"driver", case_driver},
                        {"made", case_made},         {"reset", case_reset}};
  bool ran = false;
  if (only == "unseen") {
    tapp::current_case = only;
    case_unseen();
    return 0;
  }
  for (const Case& c : cases) {
    if (!only.empty() && only != c.name) continue;
    tapp::current_case = c.name;
    c.run();
    ran = true;
  }
  if (!ran) args.die("unknown case " + only);
  return 0;
}
