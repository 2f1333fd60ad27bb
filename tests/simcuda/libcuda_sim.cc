// libcuda_sim.cc: a simulated CUDA driver (SONAME libcuda.so.1) for CPU tests.
//
// SIMCUDA_DEVICES simulated devices (default 1), whose "device memory" is host memory.
// Error codes, the cuGetProcAddress name/version mapping and the host
// registration semantics follow what was measured on an H200 (driver 580,
// CUDA 13). See README.md for the model, the env switches and the
// stale-registration detector.

#include <cuda.h>

// cuda.h maps many names to versioned symbols with macros. This file defines
// every symbol under its real (exported) name, so drop the macros we touch.
#undef cuMemHostRegister
#undef cuGetProcAddress
#undef cuCtxCreate
#undef cuCtxDestroy
#undef cuCtxPushCurrent
#undef cuCtxPopCurrent
#undef cuStreamDestroy
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
#undef cuEventDestroy
#undef cuEventElapsedTime
#undef cuStreamBeginCapture
#undef cuGraphInstantiate
#undef cuMemcpy2D
#undef cuMemcpy2DAsync
#undef cuMemcpy3D
#undef cuMemcpy3DAsync

#include <errno.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <sys/uio.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <signal.h>
#include <thread>
#include <vector>

#include "simcuda_common.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

// Handle types: cuda.h only forward-declares them.
struct CUctx_st {
  uint64_t magic;
  bool primary;
  bool alive;  // guarded by G::mu
  int dev = 0;  // the device the context belongs to
  std::set<CUctx_st*> peers;  // contexts whose memory this one may access (guarded by G::mu)
};
// Work recorded by a stream capture, replayed by cuGraphLaunch on a stream.
using GraphNode = std::function<void(CUstream)>;
struct CUstream_st {
  uint64_t magic;
  CUcontext ctx;
  unsigned flags;
  bool alive;  // guarded by G::mu
  std::atomic<int64_t> busy_until{0};
  // Stream capture, guarded by G::mu.
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  CUstreamCaptureMode capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  uint64_t capture_thread = 0;  // thread_serial() of the capturing thread
  std::vector<GraphNode> captured;
};
struct CUgraph_st {
  std::vector<GraphNode> nodes;
};
struct CUgraphExec_st {
  std::vector<GraphNode> nodes;
};
struct CUevent_st {
  uint64_t magic;
  unsigned flags;
  bool alive;
  std::atomic<bool> recorded{false};
  std::atomic<int64_t> t{0};
};

namespace {

using simcuda::env_double;
using simcuda::env_is;

constexpr uint64_t kCtxMagic = 0x51AC7C7C7C7C7C01ull;
constexpr uint64_t kStreamMagic = 0x51AC57EA357EA302ull;
constexpr uint64_t kEventMagic = 0x51ACE7E7E7E7E703ull;
constexpr unsigned kValidRegisterFlags = 0xF;  // PORTABLE|DEVICEMAP|IOMEMORY|READ_ONLY
constexpr int kMaxDevices = 16;                 // SIMCUDA_DEVICES accepts 1..kMaxDevices

struct Registration {
  size_t bytes = 0;
  unsigned flags = 0;
  CUcontext ctx = nullptr;
  bool hostalloc = false;        // from cuMemHostAlloc/cuMemAllocHost (owned by the sim)
  uintptr_t first_page = 0;
  std::vector<uint64_t> pfns;    // one per page, 0 = not present; empty if detection disabled
  std::vector<std::pair<int, unsigned>> pins;  // io_uring (ring, slot) pairs holding the frames
};

struct DevAlloc {
  size_t bytes = 0;
  size_t mapped = 0;
  CUcontext ctx = nullptr;
};

enum class StaleMode { kAbort, kCount, kOff };
enum class PfnState { kUnknown, kEnabled, kDisabled };

struct G {
  std::mutex mu;  // guards everything below that is not atomic
  std::atomic<bool> initialized{false};
  pid_t init_pid = 0;

  int devices = 1;  // SIMCUDA_DEVICES, read once at the first use of the environment
  CUctx_st primary[kMaxDevices];  // one primary context per device; handles never change
  int primary_refcount[kMaxDevices] = {};
  unsigned primary_flags[kMaxDevices] = {};
  std::set<CUctx_st*> ctxs;        // every context handle ever handed out (dead ones stay)
  std::set<CUstream_st*> streams;  // every stream ever created
  std::set<CUevent_st*> events;
  std::map<uintptr_t, Registration> regs;  // base -> registration; ranges never overlap
  std::map<uintptr_t, DevAlloc> dev;       // device allocations

  // Device timelines (steady_clock ns), one per device.
  struct Timeline {
    std::atomic<int64_t> busy_until{0};      // end of all enqueued work
    std::atomic<int64_t> legacy_busy{0};     // legacy default stream
    std::atomic<int64_t> blocking_busy{0};   // max over blocking streams
  };
  Timeline dev_time[kMaxDevices];
  std::atomic<int64_t> barrier_until{0};   // unregister "world stop" (every device)

  // Env-controlled configuration.
  std::atomic<bool> sleep_on{true};
  std::atomic<double> sleep_scale{1.0};
  std::atomic<double> kernel_us{0.0};
  std::atomic<int> stale_mode{static_cast<int>(StaleMode::kAbort)};

  // Stale detection.
  int pagemap_fd = -1;
  pid_t pagemap_pid = 0;
  std::atomic<int> pfn_state{static_cast<int>(PfnState::kUnknown)};
  int populate_supported = -1;  // -1 unknown, 0 no, 1 yes

  // Page pinning (io_uring registered buffers = FOLL_LONGTERM pins, what a
  // real driver does): keeps the frames of a registration allocated, so a
  // remapped address can never get the same frame back.
  struct Ring {
    int fd;
    std::vector<unsigned> free_slots;
  };
  std::vector<Ring> rings;
  int pin_state = -1;  // -1 unknown, 0 unavailable, 1 available

  // Counters for tests.
  std::atomic<unsigned long> stale_count{0};
  std::atomic<unsigned long> checked_pages{0};
  std::atomic<unsigned long> register_calls{0};
  std::atomic<unsigned long> unregister_calls{0};
};

G* make_g() {
  G* p = new G;
  for (int d = 0; d < kMaxDevices; ++d) {
    p->primary[d].magic = kCtxMagic;
    p->primary[d].primary = true;
    p->primary[d].alive = false;
    p->primary[d].dev = d;
  }
  return p;
}

G& g() {
  static G* p = make_g();  // leaked on purpose: usable from atexit handlers
  return *p;
}

// The per-thread context stack. Trivially destructible on purpose: exit()
// runs thread_local destructors before atexit handlers, and a program (or
// cudart) may still call the driver from those, as the real driver allows.
struct CtxStack {
  static constexpr int kMax = 256;
  CUcontext v[kMax];
  int n;
  bool empty() const { return n == 0; }
  CUcontext& back() { return v[n - 1]; }
  void pop_back() { --n; }
  void push_back(CUcontext c) {
    if (n == kMax) {
      std::fprintf(stderr, "simcuda: context stack deeper than %d\n", kMax);
      std::abort();
    }
    v[n++] = c;
  }
};
thread_local CtxStack tls_stack;

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

// ---------------------------------------------------------------- env ----
void load_env() {
  G& s = g();
  s.sleep_on = !env_is("SIMCUDA_SLEEP", "0");
  s.sleep_scale = env_double("SIMCUDA_SLEEP_SCALE", 1.0);
  s.kernel_us = env_double("SIMCUDA_KERNEL_US", 0.0);
  StaleMode m = StaleMode::kAbort;
  if (env_is("SIMCUDA_STALE", "count")) m = StaleMode::kCount;
  if (env_is("SIMCUDA_STALE", "off")) m = StaleMode::kOff;
  s.stale_mode = static_cast<int>(m);
  if (env_is("SIMCUDA_PIN", "0")) {
    std::lock_guard<std::mutex> l(s.mu);
    s.pin_state = 0;
  }
  static std::once_flag devices_once;  // the device count never changes in a process
  std::call_once(devices_once, [&s] {
    const char* v = getenv("SIMCUDA_DEVICES");
    if (v == nullptr || *v == 0) return;
    char* end = nullptr;
    long n = strtol(v, &end, 10);
    if (*end != 0 || n < 1 || n > kMaxDevices) {
      std::fprintf(stderr, "simcuda: SIMCUDA_DEVICES=%s: accepts a whole number from 1 to %d; using 1\n",
                   v, kMaxDevices);
      return;
    }
    s.devices = static_cast<int>(n);
  });
}

std::once_flag g_env_once;
void ensure_env() { std::call_once(g_env_once, load_env); }

// --------------------------------------------------------------- time ----
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Simulated duration of `us` microseconds, 0 when sleeping is off.
int64_t cost_ns(double us) {
  ensure_env();
  G& s = g();
  if (!s.sleep_on.load()) return 0;
  double ns = us * 1000.0 * s.sleep_scale.load();
  return ns > 0 ? static_cast<int64_t>(ns) : 0;
}

void sleep_until_ns(int64_t t) {
  int64_t n = now_ns();
  if (t > n) std::this_thread::sleep_for(std::chrono::nanoseconds(t - n));
}

void atomic_max(std::atomic<int64_t>& a, int64_t v) {
  int64_t cur = a.load();
  while (cur < v && !a.compare_exchange_weak(cur, v)) {
  }
}

bool is_legacy(CUstream s) {
  return s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}

// The device whose queue `s` is: a stream's context's; the legacy stream's
// is the calling thread's current context's (device 0 without one).
int stream_dev(CUstream s) {
  if (!is_legacy(s)) return s->ctx->dev;
  return (tls_stack.n > 0 && tls_stack.back() != nullptr) ? tls_stack.back()->dev : 0;
}

// Enqueue `dur` ns of work on stream s; returns its completion time. Each
// device has its own timeline; the legacy stream is ordered with the
// blocking streams of its device.
int64_t enqueue(CUstream s, int64_t dur) {
  G& st = g();
  G::Timeline& tl = st.dev_time[stream_dev(s)];
  int64_t start = std::max(now_ns(), st.barrier_until.load());
  bool blocking = true;
  if (is_legacy(s)) {
    start = std::max({start, tl.legacy_busy.load(), tl.blocking_busy.load()});
  } else {
    blocking = (s->flags & CU_STREAM_NON_BLOCKING) == 0;
    start = std::max(start, s->busy_until.load());
    if (blocking) start = std::max(start, tl.legacy_busy.load());
  }
  int64_t end = start + dur;
  if (is_legacy(s)) {
    atomic_max(tl.legacy_busy, end);
  } else {
    atomic_max(s->busy_until, end);
    if (blocking) atomic_max(tl.blocking_busy, end);
  }
  atomic_max(tl.busy_until, end);
  return end;
}

int64_t stream_done_at(CUstream s) {
  if (is_legacy(s)) {
    const G::Timeline& tl = g().dev_time[stream_dev(s)];
    return std::max(tl.legacy_busy.load(), tl.blocking_busy.load());
  }
  return s->busy_until.load();
}

// The end of all work enqueued on device `dev`, or on every device (-1).
int64_t busy_until(int dev) {
  G& s = g();
  if (dev >= 0) return s.dev_time[dev].busy_until.load();
  int64_t t = 0;
  for (int d = 0; d < kMaxDevices; ++d) t = std::max(t, s.dev_time[d].busy_until.load());
  return t;
}

// Copy time model (microseconds): pinned ~50 GB/s, pageable ~10 GB/s.
double copy_us(size_t bytes, bool pinned) {
  return pinned ? 8.0 + bytes / 50000.0 : 4.0 + bytes / 10000.0;
}

// ------------------------------------------------------------ stream work ----
// The bytes of a copy or memset move when its stream reaches it: at the
// completion time that enqueue() gave it. Work already due when it is
// submitted runs on the submitting thread (after any earlier due work); work
// due later runs then on the device thread. A host-to-device copy from pinned
// memory therefore reads the host bytes as they are at that time, and a
// device-to-host copy into pinned memory writes them then.
struct Work {
  std::mutex mu;
  std::condition_variable wake;  // the device thread: new work
  std::condition_variable done;  // waiters: some work ran
  std::map<std::pair<int64_t, uint64_t>, std::function<void()>> ops;  // (due, seq) -> op
  uint64_t seq = 0;
  int64_t running = INT64_MAX;  // due time of the op the device thread runs now
  pid_t thread_pid = 0;         // the process whose device thread exists
};
Work* g_work = new Work;  // replaced in a fork child (the device thread is gone there)
thread_local bool tls_device_thread = false;

void device_thread() {
  tls_device_thread = true;
  Work& w = *g_work;
  std::unique_lock<std::mutex> l(w.mu);
  for (;;) {
    if (w.ops.empty()) {
      w.wake.wait(l);
      continue;
    }
    auto it = w.ops.begin();
    const int64_t due = it->first.first;
    const int64_t n = now_ns();
    if (due > n) {
      w.wake.wait_for(l, std::chrono::nanoseconds(due - n));
      continue;
    }
    std::function<void()> op = std::move(it->second);
    w.ops.erase(it);
    w.running = due;
    l.unlock();
    op();
    l.lock();
    w.running = INT64_MAX;
    w.done.notify_all();
  }
}

// Caller holds w.mu.
bool ops_done_through_locked(const Work& w, int64_t t) {
  return w.running > t && (w.ops.empty() || w.ops.begin()->first.first > t);
}

// Blocks until every op due at or before t has run.
void wait_ops_through(int64_t t) {
  Work& w = *g_work;
  std::unique_lock<std::mutex> l(w.mu);
  w.done.wait(l, [&] { return ops_done_through_locked(w, t); });
}

bool ops_done_through(int64_t t) {
  Work& w = *g_work;
  std::lock_guard<std::mutex> l(w.mu);
  return ops_done_through_locked(w, t);
}

void queue_on_device(int64_t due, std::function<void()> op);

// Runs op when the device reaches time `due`.
void run_at(int64_t due, std::function<void()> op) {
  if (due <= now_ns()) {
    wait_ops_through(due);
    op();
    return;
  }
  queue_on_device(due, std::move(op));
}

// Runs op on the device thread, at time `due` or after the work due before it.
void queue_on_device(int64_t due, std::function<void()> op) {
  Work& w = *g_work;
  std::lock_guard<std::mutex> l(w.mu);
  if (w.thread_pid != getpid()) {
    // The device thread takes no signals: the program's handlers run on its own threads.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    std::thread(device_thread).detach();
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    w.thread_pid = getpid();
  }
  w.ops.emplace(std::make_pair(due, w.seq++), std::move(op));
  w.wake.notify_one();
}

// Waits until the device has reached time t and run the work due by then.
void wait_device_until(int64_t t) {
  sleep_until_ns(t);
  wait_ops_through(t);
}

// Waits for all work in flight on device `dev` (every stream, every context
// of it), or on every device (-1).
void wait_device_idle(int dev) {
  wait_device_until(std::max(busy_until(dev), g().barrier_until.load()));
}

// ------------------------------------------------------------- pagemap ----
long raw_madvise(uintptr_t addr, size_t len, int advice) {
  long r;
  do {
    r = syscall(SYS_madvise, addr, len, advice);
  } while (r != 0 && (errno == EINTR || errno == EAGAIN));
  return r;
}

void* raw_mmap(size_t len) {
  long r = syscall(SYS_mmap, nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
  if (r < 0 && r > -4096) return nullptr;
  void* p = reinterpret_cast<void*>(r);
  return p == MAP_FAILED ? nullptr : p;
}

void raw_munmap(void* p, size_t len) { syscall(SYS_munmap, p, len); }

// Caller holds mu.
bool populate_supported_locked() {
  G& s = g();
  if (s.populate_supported < 0) {
    void* p = raw_mmap(kPage);
    s.populate_supported =
        (p != nullptr && raw_madvise(reinterpret_cast<uintptr_t>(p), kPage, MADV_POPULATE_WRITE) == 0)
            ? 1
            : 0;
    if (p) raw_munmap(p, kPage);
  }
  return s.populate_supported == 1;
}

// Fault in [first, first+npages*kPage) for write without changing contents.
// Returns CUDA_SUCCESS or CUDA_ERROR_INVALID_VALUE (unmapped / not writable).
// Caller holds mu.
CUresult fault_in_locked(uintptr_t first, size_t npages, bool read_only_ok) {
  size_t len = npages * kPage;
  if (populate_supported_locked()) {
    if (raw_madvise(first, len, MADV_POPULATE_WRITE) == 0) return CUDA_SUCCESS;
    if (errno == EINVAL && read_only_ok && raw_madvise(first, len, MADV_POPULATE_READ) == 0)
      return CUDA_SUCCESS;
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Old kernel: touch each page with an atomic RMW that leaves the byte as is.
  // (READ_ONLY registrations of non-writable memory are not detectable here
  // without parsing /proc/self/maps; they would fault. Acceptable for a sim.)
  for (size_t i = 0; i < npages; ++i) {
    volatile unsigned char* b = reinterpret_cast<volatile unsigned char*>(first + i * kPage);
    __atomic_fetch_or(b, static_cast<unsigned char>(0), __ATOMIC_RELAXED);
  }
  return CUDA_SUCCESS;
}

// Caller holds mu. Returns false when pagemap cannot be read.
bool read_pfns_locked(uintptr_t first, size_t npages, uint64_t* out) {
  G& s = g();
  pid_t pid = getpid();
  if (s.pagemap_fd < 0 || s.pagemap_pid != pid) {
    // After fork() the inherited fd still describes the parent's mm: reopen.
    if (s.pagemap_fd >= 0) close(s.pagemap_fd);
    s.pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    s.pagemap_pid = pid;
    if (s.pagemap_fd < 0) return false;
  }
  size_t want = npages * sizeof(uint64_t);
  off_t off = static_cast<off_t>((first / kPage) * sizeof(uint64_t));
  char* dst = reinterpret_cast<char*>(out);
  size_t got = 0;
  while (got < want) {
    ssize_t r = pread(s.pagemap_fd, dst + got, want - got, off + static_cast<off_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  for (size_t i = 0; i < npages; ++i) {
    uint64_t e = out[i];
    bool present = (e >> 63) & 1;
    out[i] = present ? (e & ((1ull << 55) - 1)) : 0;
  }
  return true;
}

// Decide once whether PFNs are visible (root / CAP_SYS_ADMIN). Caller holds mu.
bool pfn_enabled_locked() {
  G& s = g();
  int st = s.pfn_state.load();
  if (st != static_cast<int>(PfnState::kUnknown)) return st == static_cast<int>(PfnState::kEnabled);
  bool ok = false;
  void* p = raw_mmap(kPage);
  if (p != nullptr) {
    __atomic_fetch_or(static_cast<unsigned char*>(p), static_cast<unsigned char>(1), __ATOMIC_RELAXED);
    uint64_t pfn = 0;
    ok = read_pfns_locked(reinterpret_cast<uintptr_t>(p), 1, &pfn) && pfn != 0;
    raw_munmap(p, kPage);
  }
  s.pfn_state = static_cast<int>(ok ? PfnState::kEnabled : PfnState::kDisabled);
  if (!ok)
    std::fprintf(stderr,
                 "simcuda: stale detection disabled (needs root to read /proc/self/pagemap PFNs)\n");
  return ok;
}

// ---------------------------------------------------------------- pinning ----
constexpr unsigned kRingSlots = 16384;            // IORING_MAX_REG_BUFFERS
constexpr size_t kMaxPinChunk = size_t{1} << 30;  // one io_uring buffer is at most 1 GiB

#if defined(IORING_RSRC_REGISTER_SPARSE) && defined(__NR_io_uring_setup)
int new_ring() {
  struct io_uring_params pr;
  std::memset(&pr, 0, sizeof pr);
  int fd = static_cast<int>(syscall(__NR_io_uring_setup, 1, &pr));
  if (fd < 0) return -1;
  struct io_uring_rsrc_register rr;
  std::memset(&rr, 0, sizeof rr);
  rr.nr = kRingSlots;
  rr.flags = IORING_RSRC_REGISTER_SPARSE;
  if (syscall(__NR_io_uring_register, fd, IORING_REGISTER_BUFFERS2, &rr, sizeof rr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}
bool set_slot(int fd, unsigned slot, void* base, size_t len) {
  struct iovec iv = {base, len};
  struct io_uring_rsrc_update2 up;
  std::memset(&up, 0, sizeof up);
  up.offset = slot;
  up.data = reinterpret_cast<uint64_t>(&iv);
  up.nr = 1;
  return syscall(__NR_io_uring_register, fd, IORING_REGISTER_BUFFERS_UPDATE, &up, sizeof up) == 1;
}
#else
int new_ring() { return -1; }
bool set_slot(int, unsigned, void*, size_t) { return false; }
#endif

// Caller holds mu.
void unpin_locked(Registration& r) {
  G& s = g();
  for (auto [ring, slot] : r.pins) {
    set_slot(s.rings[ring].fd, slot, nullptr, 0);
    s.rings[ring].free_slots.push_back(slot);
  }
  r.pins.clear();
}

// Pin the pages of r. Returns false (and pins nothing) if the kernel refuses,
// e.g. for read-only or file-backed memory. Caller holds mu.
bool pin_locked(Registration& r, size_t npages) {
  G& s = g();
  if (s.pin_state == 0) return false;
  size_t len = npages * kPage;
  for (size_t off = 0; off < len; off += kMaxPinChunk) {
    size_t n = std::min(kMaxPinChunk, len - off);
    int ring = -1;
    for (size_t i = 0; i < s.rings.size(); ++i)
      if (!s.rings[i].free_slots.empty()) ring = static_cast<int>(i);
    if (ring < 0) {
      int fd = new_ring();
      if (fd < 0) {
        if (s.pin_state < 0)
          std::fprintf(stderr,
                       "simcuda: io_uring page pinning unavailable; stale detection may miss "
                       "a remapped page that got its old frame back\n");
        s.pin_state = 0;
        unpin_locked(r);
        return false;
      }
      G::Ring rg{fd, {}};
      for (unsigned k = kRingSlots; k-- > 0;) rg.free_slots.push_back(k);
      s.rings.push_back(std::move(rg));
      ring = static_cast<int>(s.rings.size()) - 1;
    }
    s.pin_state = 1;
    unsigned slot = s.rings[ring].free_slots.back();
    if (!set_slot(s.rings[ring].fd, slot, reinterpret_cast<void*>(r.first_page + off), n)) {
      unpin_locked(r);
      return false;
    }
    s.rings[ring].free_slots.pop_back();
    r.pins.emplace_back(ring, slot);
  }
  return true;
}

// Remove a registration: unpin, and unmap it if the sim owns the memory.
// Caller holds mu.
std::map<uintptr_t, Registration>::iterator erase_reg_locked(
    std::map<uintptr_t, Registration>::iterator it, bool unmap_hostalloc) {
  unpin_locked(it->second);
  if (unmap_hostalloc && it->second.hostalloc)
    raw_munmap(reinterpret_cast<void*>(it->first), it->second.bytes);
  return g().regs.erase(it);
}

// Snapshot the PFNs of a registration. Caller holds mu.
void snapshot_locked(Registration& r, size_t npages) {
  r.pfns.clear();
  if (!pfn_enabled_locked()) return;
  if (r.pins.empty()) pin_locked(r, npages);
  r.pfns.resize(npages);
  if (!read_pfns_locked(r.first_page, npages, r.pfns.data())) r.pfns.clear();
}

size_t page_count(uintptr_t p, size_t bytes) {
  uintptr_t first = p & ~(uintptr_t)(kPage - 1);
  uintptr_t last = (p + bytes - 1) & ~(uintptr_t)(kPage - 1);
  return (last - first) / kPage + 1;
}

struct StaleHit {
  uintptr_t addr, base;
  size_t size, page;
  uint64_t was, now;
};

// Check the registered pages of host range [h, h+n). Caller holds mu.
void check_range_locked(uintptr_t h, size_t n, std::vector<StaleHit>& hits) {
  G& s = g();
  if (n == 0 || s.regs.empty()) return;
  if (static_cast<StaleMode>(s.stale_mode.load()) == StaleMode::kOff) return;
  uintptr_t end = h + n;
  auto it = s.regs.upper_bound(h);
  if (it != s.regs.begin()) --it;
  std::vector<uint64_t> cur;
  for (; it != s.regs.end() && it->first < end; ++it) {
    Registration& r = it->second;
    uintptr_t rb = it->first, re = rb + r.bytes;
    if (re <= h) continue;
    if (r.pfns.empty()) continue;  // detection disabled for this one
    uintptr_t lo = std::max(h, rb), hi = std::min(end, re);
    size_t i0 = ((lo & ~(uintptr_t)(kPage - 1)) - r.first_page) / kPage;
    size_t i1 = (((hi - 1) & ~(uintptr_t)(kPage - 1)) - r.first_page) / kPage;
    size_t np = i1 - i0 + 1;
    cur.resize(np);
    if (!read_pfns_locked(r.first_page + i0 * kPage, np, cur.data())) continue;
    s.checked_pages += np;
    for (size_t k = 0; k < np; ++k) {
      if (cur[k] == 0 || cur[k] != r.pfns[i0 + k]) {
        hits.push_back({std::max(lo, r.first_page + (i0 + k) * kPage), rb, r.bytes, i0 + k,
                        r.pfns[i0 + k], cur[k]});
        break;  // one report per registration per copy
      }
    }
  }
}

void report_stale(const std::vector<StaleHit>& hits) {
  G& s = g();
  for (const StaleHit& x : hits) {
    std::fprintf(stderr,
                 "simcuda: STALE REGISTRATION: DMA at %p uses registration base=%p size=%zu "
                 "page %zu whose physical frame changed (pfn 0x%llx -> 0x%llx): the memory was "
                 "unmapped/replaced after cuMemHostRegister\n",
                 reinterpret_cast<void*>(x.addr), reinterpret_cast<void*>(x.base), x.size, x.page,
                 static_cast<unsigned long long>(x.was), static_cast<unsigned long long>(x.now));
    std::fflush(stderr);
    if (static_cast<StaleMode>(s.stale_mode.load()) == StaleMode::kCount) {
      s.stale_count++;
    } else {
      std::abort();
    }
  }
}

// ------------------------------------------------------------ fork ----
// fork(): unpinned registrations (no io_uring) become copy-on-write and the
// first write in either process would move that process's view to a new
// frame. Break COW right after fork in both processes and re-snapshot, so a
// fork alone never looks like a stale mapping.
// Pinned pages need nothing in the parent: the kernel copies pinned anonymous
// pages for the child at fork time (like for a real driver's pins). The
// child gets its own frames: drop the inherited rings (they belong to the
// parent's pins), re-pin and re-snapshot there.
void repin_all_locked(bool child) {
  G& s = g();
  if (s.pfn_state.load() != static_cast<int>(PfnState::kEnabled)) return;
  if (child) {
    for (auto& rg : s.rings) close(rg.fd);
    s.rings.clear();
    if (s.pin_state == 1) s.pin_state = -1;
    for (auto& kv : s.regs) kv.second.pins.clear();
  }
  for (auto& [base, r] : s.regs) {
    size_t np = page_count(base, r.bytes);
    if (!child && !r.pins.empty()) continue;
    if (populate_supported_locked()) {
      if (raw_madvise(r.first_page, np * kPage, MADV_POPULATE_WRITE) != 0)
        raw_madvise(r.first_page, np * kPage, MADV_POPULATE_READ);
    }
    if (child) pin_locked(r, np);
    std::vector<uint64_t> cur(np);
    if (read_pfns_locked(r.first_page, np, cur.data())) r.pfns.swap(cur);
  }
}
void atfork_prepare() {
  g_work->mu.lock();
  g().mu.lock();
}
void atfork_parent() {
  repin_all_locked(false);
  g().mu.unlock();
  g_work->mu.unlock();
}
// The child has no device thread and none of the parent's work in flight: it
// starts with an empty device timeline of its own (the old one stays locked).
void atfork_child() {
  repin_all_locked(true);
  g().mu.unlock();
  g_work = new Work;
}

// ------------------------------------------------------ context helpers ----
bool valid_ctx_locked(CUcontext c) {
  G& s = g();
  return c != nullptr && ((c >= &s.primary[0] && c < &s.primary[s.devices]) || s.ctxs.count(c) != 0);
}

// Current context check: 3 if not initialized, 201 if none, 709 if destroyed.
CUresult need_ctx(CUcontext* out = nullptr) {
  if (!g().initialized.load()) return CUDA_ERROR_NOT_INITIALIZED;
  if (tls_stack.empty() || tls_stack.back() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  CUcontext c = tls_stack.back();
  {
    std::lock_guard<std::mutex> l(g().mu);
    if (!c->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  }
  if (out) *out = c;
  return CUDA_SUCCESS;
}

CUresult need_init() {
  return g().initialized.load() ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

bool valid_dev(CUdevice dev) { return dev >= 0 && dev < g().devices; }

// Drop everything a context owns. Caller holds mu.
void destroy_ctx_locked(CUcontext c) {
  G& s = g();
  c->alive = false;
  for (auto it = s.regs.begin(); it != s.regs.end();) {
    if (it->second.ctx == c) {
      it = erase_reg_locked(it, true);
    } else {
      ++it;
    }
  }
  for (auto it = s.dev.begin(); it != s.dev.end();) {
    if (it->second.ctx == c) {
      raw_munmap(reinterpret_cast<void*>(it->first), it->second.mapped);
      it = s.dev.erase(it);
    } else {
      ++it;
    }
  }
  for (CUstream_st* st : s.streams)
    if (st->ctx == c) st->alive = false;
}

// Find the registration containing p. Caller holds mu.
std::map<uintptr_t, Registration>::iterator find_reg_locked(uintptr_t p) {
  G& s = g();
  auto it = s.regs.upper_bound(p);
  if (it == s.regs.begin()) return s.regs.end();
  --it;
  return (p < it->first + it->second.bytes) ? it : s.regs.end();
}

bool overlaps_reg_locked(uintptr_t p, size_t n) {
  G& s = g();
  auto it = s.regs.upper_bound(p + n - 1);
  if (it == s.regs.begin()) return false;
  --it;
  return it->first + it->second.bytes > p;
}

// Device allocation containing [p, p+n). Caller holds mu.
bool in_dev_locked(uintptr_t p, size_t n, CUcontext* ctx = nullptr) {
  G& s = g();
  auto it = s.dev.upper_bound(p);
  if (it == s.dev.begin()) return false;
  --it;
  if (p < it->first + it->second.bytes && p + n <= it->first + it->second.bytes) {
    if (ctx) *ctx = it->second.ctx;
    return true;
  }
  return false;
}

bool valid_stream_locked(CUstream s) {
  if (is_legacy(s)) return true;
  return g().streams.count(s) != 0 && s->alive;
}

// ------------------------------------------------------ stream capture ----
// Measured on the H200: while a thread captures in global mode, a
// potentially unsafe call (cuMemHostUnregister, ...) from a thread in global
// mode is refused with 900 and invalidates that capture (its end gives 901);
// a thread in relaxed mode may make it and the capture survives.
// cuCtxSynchronize invalidates a capture in progress even in relaxed mode.
thread_local CUstreamCaptureMode tls_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

uint64_t thread_serial() {
  static std::atomic<uint64_t> next{1};
  thread_local uint64_t id = next++;
  return id;
}

bool capturing(CUstream s) {
  return !is_legacy(s) && s->capture != CU_STREAM_CAPTURE_STATUS_NONE;
}

// Refuses a potentially unsafe call (900) that a capture in progress forbids
// to this thread, and invalidates that capture. `always`: any capture in
// progress forbids it, whatever the thread's mode (a device-wide synchronize).
CUresult capture_guard(bool always = false) {
  G& st = g();
  const uint64_t me = thread_serial();
  const CUstreamCaptureMode mode = tls_capture_mode;
  std::lock_guard<std::mutex> l(st.mu);
  bool refused = false;
  for (CUstream_st* s : st.streams) {
    if (s->capture != CU_STREAM_CAPTURE_STATUS_ACTIVE) continue;
    bool forbids = always;
    if (mode == CU_STREAM_CAPTURE_MODE_GLOBAL)
      forbids |= s->capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL ||
                 (s->capture_thread == me && s->capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED);
    if (mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
      forbids |= s->capture_thread == me && s->capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED;
    if (forbids) {
      s->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
      refused = true;
    }
  }
  return refused ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

// Records `node` if s is capturing (the work does not run now). Returns
// false when s is not capturing. Caller holds mu.
bool record_if_capturing_locked(CUstream s, GraphNode node) {
  if (!capturing(s)) return false;
  if (s->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE) s->captured.push_back(std::move(node));
  return true;
}

// ----------------------------------------------------------- copy engine ----
// One contiguous piece of a copy (a 2D/3D copy is one per row).
struct Seg {
  uintptr_t dst, src;
  size_t n;
};

enum class Mem { kAny, kHost, kDevice };  // what the caller says a side is

// The host pages of a pinned side, checked when the DMA runs: pages that are
// no longer mapped (or, with stale detection, no longer the registered
// frames) are not the program's memory any more, so the DMA's bytes do not
// reach it (with a stale report). Returns false when the piece must be skipped.
bool dma_target_ok(uintptr_t h, size_t n) {
  uintptr_t first = h & ~(uintptr_t)(kPage - 1);
  size_t np = page_count(h, n);
  std::vector<unsigned char> vec(np);
  if (mincore(reinterpret_cast<void*>(first), np * kPage, vec.data()) != 0) return false;
  std::vector<StaleHit> hits;
  {
    std::lock_guard<std::mutex> l(g().mu);
    check_range_locked(h, n, hits);
  }
  if (hits.empty()) return true;
  report_stale(hits);  // aborts unless SIMCUDA_STALE=count
  return false;
}

// The copy engine. Pinned host memory (inside one registration, as the
// driver sees it) is copied when the stream reaches the copy. Pageable host
// memory behaves as measured on the H200: a host-to-device copy takes the
// source's bytes at the call (staged) and returns, a device-to-host copy
// returns once complete. Synchronous copies return once complete.
CUresult copy_engine(std::vector<Seg> segs, CUstream stream, bool async, Mem dst_mem,
                     Mem src_mem) {
  CUresult rc = need_ctx();
  if (rc != CUDA_SUCCESS) return rc;
  size_t total = 0;
  for (const Seg& x : segs) {
    if (x.n == 0) continue;
    if (x.dst == 0 || x.src == 0) return CUDA_ERROR_INVALID_VALUE;
    total += x.n;
  }
  if (total == 0) return CUDA_SUCCESS;
  std::vector<StaleHit> hits;
  bool dst_dev = true, src_dev = true, dst_pinned = true, src_pinned = true;
  // A host side's span, from its first piece's first byte to its last piece's last.
  struct Span {
    uintptr_t lo = 0, hi = 0;
    void add(uintptr_t p, size_t n) {
      if (lo == 0) lo = p;
      hi = std::max(hi, p + n);
    }
  } dst_span, src_span;
  {
    std::lock_guard<std::mutex> l(g().mu);
    if (!valid_stream_locked(stream)) return CUDA_ERROR_INVALID_HANDLE;
    const int copy_dev = stream_dev(stream);
    for (const Seg& x : segs) {
      if (x.n == 0) continue;
      bool dd = in_dev_locked(x.dst, x.n), sd = in_dev_locked(x.src, x.n);
      if (dst_mem == Mem::kDevice && !dd) return CUDA_ERROR_INVALID_VALUE;
      if (src_mem == Mem::kDevice && !sd) return CUDA_ERROR_INVALID_VALUE;
      if (dst_mem == Mem::kHost) dd = false;
      if (src_mem == Mem::kHost) sd = false;
      dst_dev &= dd;
      src_dev &= sd;
      // Pinned for this copy: inside one registration that the copying
      // device may use (PORTABLE: every device; else its own context's).
      auto inside = [&](uintptr_t h) {
        auto it = find_reg_locked(h);
        return it != g().regs.end() && h + x.n <= it->first + it->second.bytes &&
               ((it->second.flags & CU_MEMHOSTREGISTER_PORTABLE) != 0 ||
                it->second.ctx->dev == copy_dev);
      };
      if (!dd) {
        dst_pinned &= inside(x.dst);
        dst_span.add(x.dst, x.n);
        check_range_locked(x.dst, x.n, hits);
      }
      if (!sd) {
        src_pinned &= inside(x.src);
        src_span.add(x.src, x.n);
        check_range_locked(x.src, x.n, hits);
      }
    }
    // A host side that starts inside a registration (any context's: one
    // address space) must end inside it: the driver takes the side as that
    // registration's memory and refuses a span running past it (the H200,
    // driver 580: a copy from a registered 4 MiB buffer's base of 20-64 MiB
    // gives 1). A side that starts in no registration is pageable, whatever
    // it overlaps later.
    for (const Span& span : {dst_span, src_span}) {
      if (span.lo == 0) continue;
      auto it = find_reg_locked(span.lo);
      if (it != g().regs.end() && span.hi > it->first + it->second.bytes) {
        return CUDA_ERROR_INVALID_VALUE;
      }
    }
    if (async) {
      std::vector<Seg> again = segs;
      if (record_if_capturing_locked(stream, [again, dst_mem, src_mem](CUstream s) {
            copy_engine(again, s, true, dst_mem, src_mem);
          }))
        return CUDA_SUCCESS;
    }
  }
  if (!hits.empty()) report_stale(hits);
  const bool host_dst = !dst_dev, host_src = !src_dev;
  const bool pinned = (!host_dst || dst_pinned) && (!host_src || src_pinned);
  bool wait = !async || (host_dst && host_src);  // host to host: done on return
  std::shared_ptr<std::vector<unsigned char>> staged;
  if (host_src && !host_dst && !src_pinned) {
    // Pageable source: staged now, so the device gets the bytes as of the call.
    staged = std::make_shared<std::vector<unsigned char>>(total);
    size_t off = 0;
    for (Seg& x : segs) {
      if (x.n == 0) continue;
      std::memcpy(staged->data() + off, reinterpret_cast<const void*>(x.src), x.n);
      x.src = reinterpret_cast<uintptr_t>(staged->data() + off);
      off += x.n;
    }
  }
  if (host_dst && !dst_pinned) wait = true;  // pageable destination: complete on return
  int64_t end = enqueue(stream, cost_ns(copy_us(total, pinned)));
  const bool check_dst = host_dst && dst_pinned, check_src = host_src && src_pinned && !staged;
  run_at(end, [segs = std::move(segs), staged, check_dst, check_src] {
    // Checked above when it runs at once; when it runs later the memory may
    // have changed since.
    const bool later = tls_device_thread;
    for (const Seg& x : segs) {
      if (x.n == 0) continue;
      if (later && check_dst && !dma_target_ok(x.dst, x.n)) continue;
      if (later && check_src && !dma_target_ok(x.src, x.n)) continue;
      std::memmove(reinterpret_cast<void*>(x.dst), reinterpret_cast<const void*>(x.src), x.n);
    }
  });
  if (wait) wait_device_until(end);
  return CUDA_SUCCESS;
}

CUresult do_copy(uintptr_t dst, uintptr_t src, size_t n, CUstream stream, bool async,
                 int want_dst_dev, int want_src_dev) {
  auto mem = [](int want) { return want == 1 ? Mem::kDevice : want == 0 ? Mem::kHost : Mem::kAny; };
  return copy_engine({Seg{dst, src, n}}, stream, async, mem(want_dst_dev), mem(want_src_dev));
}

CUresult memset_impl(CUdeviceptr d, unsigned char v, size_t n, CUstream s, bool async) {
  CUresult rc = need_ctx();
  if (rc != CUDA_SUCCESS) return rc;
  if (n == 0) return CUDA_SUCCESS;
  {
    std::lock_guard<std::mutex> l(g().mu);
    if (!valid_stream_locked(s)) return CUDA_ERROR_INVALID_HANDLE;
    if (!in_dev_locked(d, n)) return CUDA_ERROR_INVALID_VALUE;
    if (async && record_if_capturing_locked(s, [d, v, n](CUstream st) {
          memset_impl(d, v, n, st, true);
        }))
      return CUDA_SUCCESS;
  }
  int64_t end = enqueue(s, cost_ns(2.0 + n / 1000000.0));
  run_at(end, [d, v, n] { std::memset(reinterpret_cast<void*>(d), v, n); });
  if (!async) wait_device_until(end);
  return CUDA_SUCCESS;
}

CUresult register_impl(void* p, size_t bytes, unsigned flags, bool hostalloc) {
  G& s = g();
  CUcontext ctx = nullptr;
  CUresult rc = need_ctx(&ctx);
  if (rc != CUDA_SUCCESS) return rc;
  if (p == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (flags & ~kValidRegisterFlags) return CUDA_ERROR_INVALID_VALUE;
  uintptr_t base = reinterpret_cast<uintptr_t>(p);
  if (base + bytes < base) return CUDA_ERROR_INVALID_VALUE;
  {
    std::lock_guard<std::mutex> l(s.mu);
    if (!hostalloc) {
      // Measured on the H200: registering memory from cuMemHostAlloc (or
      // cudaMallocHost) is an invalid value, not "already registered".
      auto hit = find_reg_locked(base);
      if (hit != s.regs.end() && hit->second.hostalloc) return CUDA_ERROR_INVALID_VALUE;
    }
    if (overlaps_reg_locked(base, bytes)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    Registration r;
    r.bytes = bytes;
    r.flags = flags;
    r.ctx = ctx;
    r.hostalloc = hostalloc;
    r.first_page = base & ~(uintptr_t)(kPage - 1);
    size_t np = page_count(base, bytes);
    rc = fault_in_locked(r.first_page, np, (flags & CU_MEMHOSTREGISTER_READ_ONLY) != 0);
    if (rc != CUDA_SUCCESS) return rc;
    snapshot_locked(r, np);
    s.regs.emplace(base, std::move(r));
  }
  if (!hostalloc) s.register_calls++;
  double mib = bytes / 1048576.0;
  sleep_until_ns(now_ns() + cost_ns(75.0 + 30.0 * mib));
  return CUDA_SUCCESS;
}

// ---------------------------------------------------- error strings ----
struct ErrName {
  CUresult code;
  const char* name;
  const char* text;
};
const ErrName kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT",
     "context already current"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
     "peer access is not supported between these two devices"},
    {CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
     "peer access is already enabled"},
    {CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
     "peer access has not been enabled"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation is not permitted when the stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "operation failed due to a previous error during capture"},
    {CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

}  // namespace

// =================================================================== API ====
extern "C" {

// Legacy (unversioned) names whose prototypes cuda.h hides behind macros.
CUresult CUDAAPI cuMemHostRegister(void* p, size_t bytesize, unsigned int Flags);
CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                  cuuint64_t flags);
CUresult CUDAAPI cuCtxCreate(CUcontext* pctx, unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* paramsArray, int numParams,
                                unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuCtxDestroy(CUcontext ctx);
CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx);
CUresult CUDAAPI cuCtxPopCurrent(CUcontext* pctx);
CUresult CUDAAPI cuStreamDestroy(CUstream hStream);
CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev);
CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev);
CUresult CUDAAPI cuEventDestroy(CUevent hEvent);
CUresult CUDAAPI cuEventElapsedTime(float* ms, CUevent a, CUevent b);
CUresult CUDAAPI cuStreamBeginCapture(CUstream s);

// Sim-only diagnostics (dlsym them from tests).
SIMCUDA_EXPORT unsigned long simcuda_stale_count(void);
SIMCUDA_EXPORT unsigned long simcuda_checked_pages(void);
SIMCUDA_EXPORT void simcuda_reset_counters(void);
SIMCUDA_EXPORT void simcuda_reload_env(void);
SIMCUDA_EXPORT int simcuda_stale_detection_enabled(void);
SIMCUDA_EXPORT int simcuda_pinning_enabled(void);
SIMCUDA_EXPORT unsigned long simcuda_live_registrations(void);
SIMCUDA_EXPORT unsigned long simcuda_register_calls(void);
SIMCUDA_EXPORT unsigned long simcuda_unregister_calls(void);
SIMCUDA_EXPORT int simcuda_device_busy(void);
SIMCUDA_EXPORT int simcuda_device_count(void);

#define API __attribute__((visibility("default")))

// ------------------------------------------------------------ init ----
API CUresult CUDAAPI cuInit(unsigned int Flags) {
  if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  ensure_env();
  G& s = g();
  static std::once_flag once;
  std::call_once(once, [] {
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    g().init_pid = getpid();
  });
  s.initialized = true;
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuDriverGetVersion(int* v) {
  if (!v) return CUDA_ERROR_INVALID_VALUE;
  *v = 13000;
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuDeviceGet(CUdevice* dev, int ordinal) {
  if (CUresult rc = need_init()) return rc;
  if (!dev) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_dev(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *dev = ordinal;
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuDeviceGetCount(int* count) {
  if (CUresult rc = need_init()) return rc;
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  *count = g().devices;
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuDeviceGetName(char* name, int len, CUdevice dev) {
  if (CUresult rc = need_init()) return rc;
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<size_t>(len), "%s", "simcuda H200");
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  if (CUresult rc = need_init()) return rc;
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = 150754820096ull;  // 140.4 GiB, like an H200
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuDeviceGetAttribute(int* pi, CUdevice_attribute a, CUdevice dev) {
  if (CUresult rc = need_init()) return rc;
  if (!pi) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
  int v = 0;
  switch (a) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: v = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: v = 49152; break;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: v = 1980000; break;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: v = 512; break;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = 132; break;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = 0x18 + 0x10 * dev; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: v = 2619000; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: v = 6144; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: v = 52428800; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: v = 2048; break;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: v = 3; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: v = 232448; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: v = 233472; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: v = 1; break;
    default: v = 0; break;
  }
  *pi = v;
  return CUDA_SUCCESS;
}

// ------------------------------------------------------- contexts ----
API CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  if (CUresult rc = need_init()) return rc;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> l(g().mu);
  g().primary[dev].alive = true;
  g().primary_refcount[dev]++;
  *pctx = &g().primary[dev];
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  if (CUresult rc = need_init()) return rc;
  if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
  G& s = g();
  std::unique_lock<std::mutex> l(s.mu);
  if (s.primary_refcount[dev] <= 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--s.primary_refcount[dev] == 0) {
    l.unlock();
    wait_device_idle(dev);  // the context's work completes before it goes
    l.lock();
    if (s.primary_refcount[dev] == 0 && s.primary[dev].alive) destroy_ctx_locked(&s.primary[dev]);
  }
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) {
  return cuDevicePrimaryCtxRelease_v2(dev);
}

API CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  if (CUresult rc = need_init()) return rc;
  if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
  wait_device_idle(dev);  // a reset waits for the device's outstanding work
  G& s = g();
  std::lock_guard<std::mutex> l(s.mu);
  if (s.primary[dev].alive) destroy_ctx_locked(&s.primary[dev]);
  s.primary_refcount[dev] = 0;
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }

API CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  if (CUresult rc = need_init()) return rc;
  if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> l(g().mu);
  *flags = g().primary_flags[dev];
  *active = g().primary[dev].alive ? 1 : 0;
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  (void)flags;
  if (CUresult rc = need_init()) return rc;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
  CUctx_st* c = new CUctx_st{kCtxMagic, false, true, dev, {}};
  {
    std::lock_guard<std::mutex> l(g().mu);
    g().ctxs.insert(c);
  }
  tls_stack.push_back(c);
  *pctx = c;
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuCtxCreate(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return cuCtxCreate_v2(pctx, flags, dev);
}
API CUresult CUDAAPI cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam*, int, unsigned int flags,
                                    CUdevice dev) {
  return cuCtxCreate_v2(pctx, flags, dev);
}
API CUresult CUDAAPI cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams*, unsigned int flags,
                                    CUdevice dev) {
  return cuCtxCreate_v2(pctx, flags, dev);
}

API CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx) {
  if (CUresult rc = need_init()) return rc;
  {
    std::lock_guard<std::mutex> l(g().mu);
    if (!valid_ctx_locked(ctx) || ctx->primary || !ctx->alive) return CUDA_ERROR_INVALID_CONTEXT;
  }
  wait_device_idle(ctx->dev);  // the context's work completes before it goes
  {
    std::lock_guard<std::mutex> l(g().mu);
    if (!valid_ctx_locked(ctx) || ctx->primary || !ctx->alive) return CUDA_ERROR_INVALID_CONTEXT;
    destroy_ctx_locked(ctx);
  }
  if (!tls_stack.empty() && tls_stack.back() == ctx) tls_stack.pop_back();
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuCtxDestroy(CUcontext ctx) { return cuCtxDestroy_v2(ctx); }

API CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  if (CUresult rc = need_init()) return rc;
  if (ctx == nullptr) {
    if (!tls_stack.empty()) tls_stack.pop_back();
    return CUDA_SUCCESS;
  }
  {
    std::lock_guard<std::mutex> l(g().mu);
    if (!valid_ctx_locked(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  }
  if (tls_stack.empty())
    tls_stack.push_back(ctx);
  else
    tls_stack.back() = ctx;
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuCtxGetCurrent(CUcontext* pctx) {
  if (CUresult rc = need_init()) return rc;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  *pctx = tls_stack.empty() ? nullptr : tls_stack.back();
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx) {
  if (CUresult rc = need_init()) return rc;
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  {
    std::lock_guard<std::mutex> l(g().mu);
    if (!valid_ctx_locked(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  }
  tls_stack.push_back(ctx);
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx) { return cuCtxPushCurrent_v2(ctx); }

API CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext* pctx) {
  if (CUresult rc = need_init()) return rc;
  if (tls_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx) *pctx = tls_stack.back();
  tls_stack.pop_back();
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuCtxPopCurrent(CUcontext* pctx) { return cuCtxPopCurrent_v2(pctx); }

API CUresult CUDAAPI cuCtxGetDevice(CUdevice* dev) {
  CUcontext c = nullptr;
  if (CUresult rc = need_ctx(&c)) return rc;
  if (!dev) return CUDA_ERROR_INVALID_VALUE;
  *dev = c->dev;
  return CUDA_SUCCESS;
}

// Waits for the current context's device (the sim keeps one timeline per
// device, shared by the contexts on it).
API CUresult CUDAAPI cuCtxSynchronize(void) {
  CUcontext c = nullptr;
  if (CUresult rc = need_ctx(&c)) return rc;
  if (CUresult rc = capture_guard(true)) return rc;
  wait_device_idle(c->dev);
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (*mode != CU_STREAM_CAPTURE_MODE_GLOBAL && *mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      *mode != CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_ERROR_INVALID_VALUE;
  std::swap(*mode, tls_capture_mode);
  return CUDA_SUCCESS;
}

// --------------------------------------------------- host registration ----
API CUresult CUDAAPI cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int Flags) {
  return register_impl(p, bytesize, Flags, false);
}
API CUresult CUDAAPI cuMemHostRegister(void* p, size_t bytesize, unsigned int Flags) {
  return register_impl(p, bytesize, Flags, false);
}

API CUresult CUDAAPI cuMemHostUnregister(void* p) {
  G& s = g();
  if (CUresult rc = need_ctx()) return rc;
  if (CUresult rc = capture_guard()) return rc;
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  size_t bytes = 0;
  {
    std::lock_guard<std::mutex> l(s.mu);
    auto it = find_reg_locked(reinterpret_cast<uintptr_t>(p));
    if (it == s.regs.end()) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    if (it->second.hostalloc) return CUDA_ERROR_INVALID_VALUE;  // measured on the H200
    if (it->first != reinterpret_cast<uintptr_t>(p)) return CUDA_ERROR_INVALID_VALUE;
    bytes = it->second.bytes;
    erase_reg_locked(it, false);
  }
  s.unregister_calls++;
  // The real unregister waits for ALL work on the device and stalls every
  // other submitter meanwhile: raise the barrier, then wait it out.
  double mib = bytes / 1048576.0;
  int64_t cost = cost_ns(43.0 + 14.0 * mib);
  const int64_t in_flight = busy_until(-1);  // every device (README: an assumption)
  int64_t until = std::max(now_ns(), in_flight) + cost;
  atomic_max(s.barrier_until, until);
  sleep_until_ns(until);
  wait_ops_through(in_flight);
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuMemHostGetFlags(unsigned int* pFlags, void* p) {
  if (CUresult rc = need_ctx()) return rc;
  if (!pFlags || !p) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(g().mu);
  auto it = find_reg_locked(reinterpret_cast<uintptr_t>(p));
  if (it == g().regs.end()) return CUDA_ERROR_INVALID_VALUE;
  // Measured on the H200: flags 0 -> 2, 3 -> 3, READ_ONLY (8) -> 2: the driver
  // reports PORTABLE as given and DEVICEMAP always. A cuMemHostAlloc block
  // also keeps WRITECOMBINED (documented: the flags given at allocation;
  // DEVICEMAP always, as unified addressing maps every block).
  const unsigned kept = it->second.hostalloc ? CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_WRITECOMBINED
                                             : CU_MEMHOSTREGISTER_PORTABLE;
  *pFlags = (it->second.flags & kept) | CU_MEMHOSTREGISTER_DEVICEMAP;
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr, void* p, unsigned int Flags) {
  if (CUresult rc = need_ctx()) return rc;
  if (!pdptr) return CUDA_ERROR_INVALID_VALUE;
  *pdptr = 0;
  if (!p || Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(g().mu);
  if (find_reg_locked(reinterpret_cast<uintptr_t>(p)) == g().regs.end())
    return CUDA_ERROR_INVALID_VALUE;
  *pdptr = reinterpret_cast<CUdeviceptr>(p);  // unified addressing
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuMemHostAlloc(void** pp, size_t bytes, unsigned int Flags) {
  if (CUresult rc = need_ctx()) return rc;
  if (!pp) return CUDA_ERROR_INVALID_VALUE;
  *pp = nullptr;
  if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (Flags & ~0x7u) return CUDA_ERROR_INVALID_VALUE;  // PORTABLE|DEVICEMAP|WRITECOMBINED
  size_t len = (bytes + kPage - 1) & ~(kPage - 1);
  void* p = raw_mmap(len);
  if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
  // The flags as given (WRITECOMBINED included): cuMemHostGetFlags passes
  // them back (CUDA's documentation).
  CUresult rc = register_impl(p, len, Flags, true);
  if (rc != CUDA_SUCCESS) {
    raw_munmap(p, len);
    return rc;
  }
  *pp = p;
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuMemAllocHost_v2(void** pp, size_t bytes) { return cuMemHostAlloc(pp, bytes, 0); }

API CUresult CUDAAPI cuMemFreeHost(void* p) {
  if (CUresult rc = need_ctx()) return rc;
  if (CUresult rc = capture_guard()) return rc;
  G& s = g();
  size_t len = 0;
  {
    std::lock_guard<std::mutex> l(s.mu);
    auto it = s.regs.find(reinterpret_cast<uintptr_t>(p));
    if (it == s.regs.end() || !it->second.hostalloc) return CUDA_ERROR_INVALID_VALUE;
    len = it->second.bytes;
    erase_reg_locked(it, false);
  }
  wait_device_idle(-1);  // like cuMemHostUnregister: all work in flight, every device
  raw_munmap(p, len);
  return CUDA_SUCCESS;
}

// -------------------------------------------------------- device memory ----
API CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) {
  CUcontext ctx = nullptr;
  if (CUresult rc = need_ctx(&ctx)) return rc;
  if (!dptr) return CUDA_ERROR_INVALID_VALUE;
  *dptr = 0;
  if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  size_t len = (bytes + kPage - 1) & ~(kPage - 1);
  void* p = raw_mmap(len);
  if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
  {
    std::lock_guard<std::mutex> l(g().mu);
    g().dev[reinterpret_cast<uintptr_t>(p)] = DevAlloc{bytes, len, ctx};
  }
  *dptr = reinterpret_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
  if (CUresult rc = need_ctx()) return rc;
  if (CUresult rc = capture_guard()) return rc;
  G& s = g();
  size_t len = 0;
  {
    std::lock_guard<std::mutex> l(s.mu);
    auto it = s.dev.find(dptr);
    if (it == s.dev.end()) return CUDA_ERROR_INVALID_VALUE;
    len = it->second.mapped;
    s.dev.erase(it);
  }
  wait_device_idle(-1);  // cuMemFree synchronizes (every device: an assumption)
  raw_munmap(reinterpret_cast<void*>(dptr), len);
  return CUDA_SUCCESS;
}

// Documented: the base and size of the allocation holding `dptr`.
API CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr dptr) {
  if (CUresult rc = need_ctx()) return rc;
  std::lock_guard<std::mutex> l(g().mu);
  auto it = g().dev.upper_bound(dptr);
  if (it == g().dev.begin()) return CUDA_ERROR_NOT_FOUND;
  --it;
  if (dptr >= it->first + it->second.bytes) return CUDA_ERROR_NOT_FOUND;
  if (base) *base = it->first;
  if (size) *size = it->second.bytes;
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  return do_copy(dst, reinterpret_cast<uintptr_t>(src), n, nullptr, false, 1, 0);
}
API CUresult CUDAAPI cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  return do_copy(reinterpret_cast<uintptr_t>(dst), src, n, nullptr, false, 0, 1);
}
API CUresult CUDAAPI cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return do_copy(dst, src, n, nullptr, false, 1, 1);
}
API CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return do_copy(dst, src, n, nullptr, false, -1, -1);
}
API CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  return do_copy(dst, src, n, s, true, -1, -1);
}
API CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, CUstream s) {
  return do_copy(dst, reinterpret_cast<uintptr_t>(src), n, s, true, 1, 0);
}
API CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, CUstream s) {
  return do_copy(reinterpret_cast<uintptr_t>(dst), src, n, s, true, 0, 1);
}

// ------------------------------------------------------------ peers ----
// Documented (cuMemcpyPeer): a copy between device memory of two contexts,
// which need not have peer access enabled; it runs on the current context's
// stream. The sim checks that each side is device memory of its context.
namespace {
CUresult peer_copy(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx,
                   size_t n, CUstream s, bool async) {
  if (CUresult rc = need_ctx()) return rc;
  if (n == 0) return CUDA_SUCCESS;
  {
    std::lock_guard<std::mutex> l(g().mu);
    if (!valid_ctx_locked(dst_ctx) || !valid_ctx_locked(src_ctx) || !dst_ctx->alive ||
        !src_ctx->alive)
      return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext dc = nullptr, sc = nullptr;
    if (!in_dev_locked(dst, n, &dc) || !in_dev_locked(src, n, &sc) || dc != dst_ctx || sc != src_ctx)
      return CUDA_ERROR_INVALID_VALUE;
  }
  return do_copy(dst, src, n, s, async, 1, 1);
}
}  // namespace

API CUresult CUDAAPI cuMemcpyPeer(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src,
                                  CUcontext src_ctx, size_t n) {
  return peer_copy(dst, dst_ctx, src, src_ctx, n, nullptr, false);
}
API CUresult CUDAAPI cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src,
                                       CUcontext src_ctx, size_t n, CUstream s) {
  return peer_copy(dst, dst_ctx, src, src_ctx, n, s, true);
}

// Documented: 1 when `dev` can access `peer`'s memory directly. The sim's
// devices all can, but not themselves (the real driver answers 0 for
// dev == peer: an assumption to check).
API CUresult CUDAAPI cuDeviceCanAccessPeer(int* can, CUdevice dev, CUdevice peer) {
  if (CUresult rc = need_init()) return rc;
  if (!can) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_dev(dev) || !valid_dev(peer)) return CUDA_ERROR_INVALID_DEVICE;
  *can = dev != peer ? 1 : 0;
  return CUDA_SUCCESS;
}

// Documented codes: flags other than 0: 1; a peer that cannot be accessed
// (the same device): 217 (PEER_ACCESS_UNSUPPORTED); already enabled: 704; an
// invalid peer context: 201.
API CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  CUcontext c = nullptr;
  if (CUresult rc = need_ctx(&c)) return rc;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(g().mu);
  if (!valid_ctx_locked(peer) || !peer->alive) return CUDA_ERROR_INVALID_CONTEXT;
  if (peer->dev == c->dev) return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
  if (!c->peers.insert(peer).second) return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
  return CUDA_SUCCESS;
}

// Documented: 705 (PEER_ACCESS_NOT_ENABLED) when it was not enabled.
API CUresult CUDAAPI cuCtxDisablePeerAccess(CUcontext peer) {
  CUcontext c = nullptr;
  if (CUresult rc = need_ctx(&c)) return rc;
  std::lock_guard<std::mutex> l(g().mu);
  if (!valid_ctx_locked(peer)) return CUDA_ERROR_INVALID_CONTEXT;
  if (c->peers.erase(peer) == 0) return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
  return CUDA_SUCCESS;
}
namespace {
// One side of a 2D/3D copy: its base address and the Mem the caller gave.
bool side(CUmemorytype t, const void* host, CUdeviceptr dev, uintptr_t* base, Mem* mem) {
  switch (t) {
    case CU_MEMORYTYPE_HOST: *base = reinterpret_cast<uintptr_t>(host); *mem = Mem::kHost; return true;
    case CU_MEMORYTYPE_DEVICE: *base = dev; *mem = Mem::kDevice; return true;
    case CU_MEMORYTYPE_UNIFIED: *base = dev; *mem = Mem::kAny; return true;
    default: return false;  // CUDA arrays are not simulated
  }
}

CUresult copy3d(const CUDA_MEMCPY3D* c, CUstream s, bool async) {
  if (!c) return CUDA_ERROR_INVALID_VALUE;
  uintptr_t sb = 0, db = 0;
  Mem sm, dm;
  if (!side(c->srcMemoryType, c->srcHost, c->srcDevice, &sb, &sm) ||
      !side(c->dstMemoryType, c->dstHost, c->dstDevice, &db, &dm))
    return CUDA_ERROR_INVALID_VALUE;
  const size_t w = c->WidthInBytes, h = c->Height, d = c->Depth;
  const size_t sp = c->srcPitch ? c->srcPitch : w, dp = c->dstPitch ? c->dstPitch : w;
  const size_t sh = c->srcHeight ? c->srcHeight : h, dh = c->dstHeight ? c->dstHeight : h;
  if ((h > 1 || d > 1) && (sp < w + c->srcXInBytes || dp < w + c->dstXInBytes))
    return CUDA_ERROR_INVALID_VALUE;
  if (d > 1 && (sh < h + c->srcY || dh < h + c->dstY)) return CUDA_ERROR_INVALID_VALUE;
  std::vector<Seg> segs;
  segs.reserve(h * d);
  for (size_t z = 0; z < d; ++z)
    for (size_t y = 0; y < h; ++y)
      segs.push_back({db + (c->dstZ + z) * dh * dp + (c->dstY + y) * dp + c->dstXInBytes,
                      sb + (c->srcZ + z) * sh * sp + (c->srcY + y) * sp + c->srcXInBytes, w});
  return copy_engine(std::move(segs), s, async, dm, sm);
}

CUresult copy2d(const CUDA_MEMCPY2D* c, CUstream s, bool async) {
  if (!c) return CUDA_ERROR_INVALID_VALUE;
  CUDA_MEMCPY3D t;
  std::memset(&t, 0, sizeof t);
  t.srcXInBytes = c->srcXInBytes, t.srcY = c->srcY, t.srcMemoryType = c->srcMemoryType;
  t.srcHost = c->srcHost, t.srcDevice = c->srcDevice, t.srcArray = c->srcArray;
  t.srcPitch = c->srcPitch;
  t.dstXInBytes = c->dstXInBytes, t.dstY = c->dstY, t.dstMemoryType = c->dstMemoryType;
  t.dstHost = c->dstHost, t.dstDevice = c->dstDevice, t.dstArray = c->dstArray;
  t.dstPitch = c->dstPitch;
  t.WidthInBytes = c->WidthInBytes, t.Height = c->Height, t.Depth = 1;
  return copy3d(&t, s, async);
}
}  // namespace

API CUresult CUDAAPI cuMemcpy2D_v2(const CUDA_MEMCPY2D* c) { return copy2d(c, nullptr, false); }
API CUresult CUDAAPI cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D* c, CUstream s) {
  return copy2d(c, s, true);
}
// The sim has no alignment limits: unaligned is the same copy.
API CUresult CUDAAPI cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D* c) {
  return copy2d(c, nullptr, false);
}
API CUresult CUDAAPI cuMemcpy3D_v2(const CUDA_MEMCPY3D* c) { return copy3d(c, nullptr, false); }
API CUresult CUDAAPI cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D* c, CUstream s) {
  return copy3d(c, s, true);
}
API CUresult CUDAAPI cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) {
  return memset_impl(d, v, n, nullptr, false);
}
API CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) {
  return memset_impl(d, v, n, s, true);
}

// ------------------------------------------------------ pointer queries ----
namespace {
struct PtrInfo {
  int kind;  // 0 unregistered host, 1 registered host, 2 device
  CUcontext ctx;
  uintptr_t base;
  size_t size;
};
PtrInfo classify(uintptr_t p) {
  std::lock_guard<std::mutex> l(g().mu);
  CUcontext c = nullptr;
  if (in_dev_locked(p, 1, &c)) {
    auto it = g().dev.upper_bound(p);
    --it;
    return {2, c, it->first, it->second.bytes};
  }
  auto it = find_reg_locked(p);
  if (it != g().regs.end()) return {1, it->second.ctx, it->first, it->second.bytes};
  return {0, nullptr, 0, 0};
}

// Returns false for attributes the sim does not model.
bool fill_attr(const PtrInfo& i, CUpointer_attribute a, void* data, uintptr_t p, bool* valid) {
  *valid = true;
  switch (a) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      *static_cast<CUcontext*>(data) = i.ctx;
      *valid = i.kind != 0;
      return true;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned*>(data) =
          i.kind == 2 ? unsigned{CU_MEMORYTYPE_DEVICE} : (i.kind == 1 ? unsigned{CU_MEMORYTYPE_HOST} : 0u);
      *valid = i.kind != 0;
      return true;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      *static_cast<CUdeviceptr*>(data) = i.kind != 0 ? p : 0;
      *valid = i.kind != 0;
      return true;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      // Unregistered memory too (H100, driver 580): the address asked about.
      *static_cast<void**>(data) = i.kind != 2 ? reinterpret_cast<void*>(p) : nullptr;
      *valid = i.kind == 1;
      return true;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
      *static_cast<int*>(data) = 0;
      *valid = i.kind != 0;
      return true;
    case CU_POINTER_ATTRIBUTE_MAPPED:
      *static_cast<int*>(data) = i.kind != 0 ? 1 : 0;
      *valid = i.kind != 0;
      return true;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      *static_cast<unsigned long long*>(data) = i.base;
      *valid = i.kind != 0;
      return true;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *static_cast<int*>(data) = i.kind != 0 ? i.ctx->dev : -2;
      *valid = i.kind != 0;
      return true;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(data) = i.base;
      *valid = i.kind != 0;
      return true;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<size_t*>(data) = i.size;
      *valid = i.kind != 0;
      return true;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
      *static_cast<int*>(data) = i.kind != 0 ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE : 0;
      *valid = i.kind != 0;
      return true;
    default:
      return false;
  }
}
}  // namespace

API CUresult CUDAAPI cuPointerGetAttribute(void* data, CUpointer_attribute a, CUdeviceptr ptr) {
  if (CUresult rc = need_init()) return rc;
  if (!data) return CUDA_ERROR_INVALID_VALUE;
  PtrInfo i = classify(ptr);
  alignas(16) unsigned char tmp[16];
  bool valid = false;
  if (!fill_attr(i, a, tmp, ptr, &valid)) return CUDA_ERROR_INVALID_VALUE;
  if (!valid) return CUDA_ERROR_INVALID_VALUE;  // measured: unregistered host memory -> 1
  fill_attr(i, a, data, ptr, &valid);
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuPointerGetAttributes(unsigned int n, CUpointer_attribute* attrs, void** data,
                                            CUdeviceptr ptr) {
  if (CUresult rc = need_init()) return rc;
  if (n == 0 || !attrs || !data) return CUDA_ERROR_INVALID_VALUE;
  PtrInfo i = classify(ptr);
  for (unsigned k = 0; k < n; ++k) {
    if (!data[k]) return CUDA_ERROR_INVALID_VALUE;
    bool valid;
    if (!fill_attr(i, attrs[k], data[k], ptr, &valid)) return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

// ---------------------------------------------------- streams / events ----
API CUresult CUDAAPI cuStreamCreate(CUstream* ps, unsigned int flags) {
  CUcontext ctx = nullptr;
  if (CUresult rc = need_ctx(&ctx)) return rc;
  if (!ps || (flags & ~1u)) return CUDA_ERROR_INVALID_VALUE;
  CUstream_st* s = new CUstream_st;
  s->magic = kStreamMagic;
  s->ctx = ctx;
  s->flags = flags;
  s->alive = true;
  {
    std::lock_guard<std::mutex> l(g().mu);
    g().streams.insert(s);
  }
  *ps = s;
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuStreamDestroy_v2(CUstream s) {
  if (CUresult rc = need_ctx()) return rc;
  std::lock_guard<std::mutex> l(g().mu);
  if (is_legacy(s) || !valid_stream_locked(s)) return CUDA_ERROR_INVALID_HANDLE;
  s->alive = false;  // handle memory is kept so stale handles are detected
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuStreamDestroy(CUstream s) { return cuStreamDestroy_v2(s); }

// Synchronizing with or querying a stream that is capturing is refused and
// invalidates the capture.
CUresult stream_check(CUstream s) {
  std::lock_guard<std::mutex> l(g().mu);
  if (!valid_stream_locked(s)) return CUDA_ERROR_INVALID_HANDLE;
  if (capturing(s)) {
    s->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuStreamSynchronize(CUstream s) {
  if (CUresult rc = need_ctx()) return rc;
  if (CUresult rc = stream_check(s)) return rc;
  wait_device_until(std::max(stream_done_at(s), g().barrier_until.load()));
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuStreamGetFlags(CUstream s, unsigned int* flags) {
  if (CUresult rc = need_ctx()) return rc;
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult rc = stream_check(s)) return rc;
  *flags = is_legacy(s) ? 0 : s->flags;
  return CUDA_SUCCESS;
}

// 600 while any of the stream's work is in flight (not yet reached or not yet run).
API CUresult CUDAAPI cuStreamQuery(CUstream s) {
  if (CUresult rc = need_ctx()) return rc;
  if (CUresult rc = stream_check(s)) return rc;
  const int64_t t = stream_done_at(s);
  return now_ns() >= t && ops_done_through(t) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

// ---------------------------------------------------------- capture API ----
API CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
  if (CUresult rc = need_ctx()) return rc;
  if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      mode != CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_ERROR_INVALID_VALUE;
  if (is_legacy(s)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  std::lock_guard<std::mutex> l(g().mu);
  if (!valid_stream_locked(s)) return CUDA_ERROR_INVALID_HANDLE;
  if (s->capture != CU_STREAM_CAPTURE_STATUS_NONE) return CUDA_ERROR_ILLEGAL_STATE;
  s->capture = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  s->capture_mode = mode;
  s->capture_thread = thread_serial();
  s->captured.clear();
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuStreamBeginCapture(CUstream s) {
  return cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
}

API CUresult CUDAAPI cuStreamEndCapture(CUstream s, CUgraph* graph) {
  if (CUresult rc = need_ctx()) return rc;
  if (!graph) return CUDA_ERROR_INVALID_VALUE;
  *graph = nullptr;
  if (is_legacy(s)) return CUDA_ERROR_ILLEGAL_STATE;
  std::lock_guard<std::mutex> l(g().mu);
  if (!valid_stream_locked(s)) return CUDA_ERROR_INVALID_HANDLE;
  if (s->capture == CU_STREAM_CAPTURE_STATUS_NONE) return CUDA_ERROR_ILLEGAL_STATE;
  if (s->capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED && s->capture_thread != thread_serial())
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  const bool invalidated = s->capture == CU_STREAM_CAPTURE_STATUS_INVALIDATED;
  s->capture = CU_STREAM_CAPTURE_STATUS_NONE;
  std::vector<GraphNode> nodes = std::move(s->captured);
  s->captured.clear();
  if (invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  *graph = new CUgraph_st{std::move(nodes)};
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus* status) {
  if (CUresult rc = need_ctx()) return rc;
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(g().mu);
  if (!valid_stream_locked(s)) return CUDA_ERROR_INVALID_HANDLE;
  *status = is_legacy(s) ? CU_STREAM_CAPTURE_STATUS_NONE : s->capture;
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph,
                                                 unsigned long long flags) {
  (void)flags;
  if (CUresult rc = need_ctx()) return rc;
  if (!exec || !graph) return CUDA_ERROR_INVALID_VALUE;
  *exec = new CUgraphExec_st{graph->nodes};
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuGraphLaunch(CUgraphExec exec, CUstream s) {
  if (CUresult rc = need_ctx()) return rc;
  if (!exec) return CUDA_ERROR_INVALID_VALUE;
  {
    std::lock_guard<std::mutex> l(g().mu);
    if (!valid_stream_locked(s)) return CUDA_ERROR_INVALID_HANDLE;
  }
  for (const GraphNode& n : exec->nodes) n(s);
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuGraphCreate(CUgraph* graph, unsigned int flags) {
  if (CUresult rc = need_ctx()) return rc;
  if (!graph || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  *graph = new CUgraph_st{};
  return CUDA_SUCCESS;
}

// An explicit memcpy node: replayed by cuGraphLaunch as cuMemcpy3DAsync on the
// launch's stream, after the nodes added before it (dependencies are not
// simulated: nodes run in the order they were added).
API CUresult CUDAAPI cuGraphAddMemcpyNode(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps,
                                          size_t count, const CUDA_MEMCPY3D* copy, CUcontext ctx) {
  (void)deps, (void)count, (void)ctx;
  if (CUresult rc = need_ctx()) return rc;
  if (!node || !graph || !copy) return CUDA_ERROR_INVALID_VALUE;
  const CUDA_MEMCPY3D c = *copy;
  graph->nodes.push_back([c](CUstream st) { copy3d(&c, st, true); });
  *node = reinterpret_cast<CUgraphNode>(static_cast<uintptr_t>(graph->nodes.size()));
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuGraphDestroy(CUgraph graph) {
  if (!graph) return CUDA_ERROR_INVALID_VALUE;
  delete graph;
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec exec) {
  if (!exec) return CUDA_ERROR_INVALID_VALUE;
  delete exec;
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuEventCreate(CUevent* pe, unsigned int flags) {
  if (CUresult rc = need_ctx()) return rc;
  if (!pe) return CUDA_ERROR_INVALID_VALUE;
  CUevent_st* e = new CUevent_st;
  e->magic = kEventMagic;
  e->flags = flags;
  e->alive = true;
  std::lock_guard<std::mutex> l(g().mu);
  g().events.insert(e);
  *pe = e;
  return CUDA_SUCCESS;
}

namespace {
bool valid_event(CUevent e) {
  std::lock_guard<std::mutex> l(g().mu);
  return e != nullptr && g().events.count(e) != 0 && e->alive;
}
}  // namespace

API CUresult CUDAAPI cuEventRecord(CUevent e, CUstream s) {
  if (CUresult rc = need_ctx()) return rc;
  if (!valid_event(e)) return CUDA_ERROR_INVALID_HANDLE;
  {
    std::lock_guard<std::mutex> l(g().mu);
    if (!valid_stream_locked(s)) return CUDA_ERROR_INVALID_HANDLE;
  }
  e->t = std::max(now_ns(), stream_done_at(s));
  e->recorded = true;
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuEventQuery(CUevent e) {
  if (CUresult rc = need_ctx()) return rc;
  if (!valid_event(e)) return CUDA_ERROR_INVALID_HANDLE;
  if (!e->recorded) return CUDA_SUCCESS;
  const int64_t t = e->t.load();
  return now_ns() >= t && ops_done_through(t) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

API CUresult CUDAAPI cuEventSynchronize(CUevent e) {
  if (CUresult rc = need_ctx()) return rc;
  if (!valid_event(e)) return CUDA_ERROR_INVALID_HANDLE;
  if (e->recorded) wait_device_until(e->t.load());
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuEventElapsedTime_v2(float* ms, CUevent a, CUevent b) {
  if (CUresult rc = need_ctx()) return rc;
  if (!ms) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_event(a) || !valid_event(b)) return CUDA_ERROR_INVALID_HANDLE;
  if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
  if (!a->recorded || !b->recorded) return CUDA_ERROR_INVALID_HANDLE;
  int64_t n = now_ns();
  if (n < a->t.load() || n < b->t.load()) return CUDA_ERROR_NOT_READY;
  *ms = static_cast<float>((b->t.load() - a->t.load()) / 1e6);
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuEventElapsedTime(float* ms, CUevent a, CUevent b) {
  return cuEventElapsedTime_v2(ms, a, b);
}

API CUresult CUDAAPI cuEventDestroy_v2(CUevent e) {
  if (CUresult rc = need_ctx()) return rc;
  if (!valid_event(e)) return CUDA_ERROR_INVALID_HANDLE;
  std::lock_guard<std::mutex> l(g().mu);
  e->alive = false;
  return CUDA_SUCCESS;
}
API CUresult CUDAAPI cuEventDestroy(CUevent e) { return cuEventDestroy_v2(e); }

API CUresult CUDAAPI cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) {
  (void)flags;
  if (CUresult rc = need_ctx()) return rc;
  if (!valid_event(e)) return CUDA_ERROR_INVALID_HANDLE;
  {
    std::lock_guard<std::mutex> l(g().mu);
    if (!valid_stream_locked(s)) return CUDA_ERROR_INVALID_HANDLE;
  }
  if (!e->recorded) return CUDA_SUCCESS;
  int64_t t = e->t.load();
  if (is_legacy(s))
    atomic_max(g().dev_time[stream_dev(s)].legacy_busy, t);
  else
    atomic_max(s->busy_until, t);
  return CUDA_SUCCESS;
}

// A launch never runs device code: it only occupies the stream for
// SIMCUDA_KERNEL_US microseconds (scaled; 0 when SIMCUDA_SLEEP=0).
API CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                    unsigned int bx, unsigned int by, unsigned int bz,
                                    unsigned int shmem, CUstream s, void** params, void** extra) {
  (void)f, (void)shmem, (void)params, (void)extra;
  if (CUresult rc = need_ctx()) return rc;
  if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (static_cast<uint64_t>(bx) * by * bz > 1024) return CUDA_ERROR_INVALID_VALUE;
  {
    std::lock_guard<std::mutex> l(g().mu);
    if (!valid_stream_locked(s)) return CUDA_ERROR_INVALID_HANDLE;
    if (record_if_capturing_locked(s, [](CUstream st) { enqueue(st, cost_ns(g().kernel_us.load())); }))
      return CUDA_SUCCESS;
  }
  enqueue(s, cost_ns(g().kernel_us.load()));
  return CUDA_SUCCESS;
}

// A host function runs on the device thread when its stream reaches it; the
// stream's later work (and whatever waits for it) waits until it returns, so
// a function that waits for the program holds the stream as on a GPU.
API CUresult CUDAAPI cuLaunchHostFunc(CUstream s, CUhostFn fn, void* data) {
  if (CUresult rc = need_ctx()) return rc;
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  {
    std::lock_guard<std::mutex> l(g().mu);
    if (!valid_stream_locked(s)) return CUDA_ERROR_INVALID_HANDLE;
  }
  queue_on_device(enqueue(s, 0), [fn, data] { fn(data); });
  return CUDA_SUCCESS;
}

// ------------------------------------------------------- error strings ----
API CUresult CUDAAPI cuGetErrorString(CUresult e, const char** p) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  for (const auto& x : kErrors)
    if (x.code == e) {
      *p = x.text;
      return CUDA_SUCCESS;
    }
  *p = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

API CUresult CUDAAPI cuGetErrorName(CUresult e, const char** p) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  for (const auto& x : kErrors)
    if (x.code == e) {
      *p = x.name;
      return CUDA_SUCCESS;
    }
  *p = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

// ------------------------------------------------------ cuGetProcAddress ----
namespace {
struct ProcEntry {
  const char* name;
  int min_version;  // the entry applies for cudaVersion >= min_version
  void* fn;
};
#define P(name, ver, fn) {name, ver, reinterpret_cast<void*>(&fn)}
// Several entries per name: sorted by min_version ascending; the last that
// applies wins (the real driver's versioned-symbol table, approximately).
const ProcEntry kProcs[] = {
    P("cuInit", 2000, cuInit),
    P("cuDriverGetVersion", 2020, cuDriverGetVersion),
    P("cuDeviceGet", 2000, cuDeviceGet),
    P("cuDeviceGetCount", 2000, cuDeviceGetCount),
    P("cuDeviceGetName", 2000, cuDeviceGetName),
    P("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    P("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
    P("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    P("cuDevicePrimaryCtxRelease", 7000, cuDevicePrimaryCtxRelease),
    P("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    P("cuDevicePrimaryCtxReset", 7000, cuDevicePrimaryCtxReset),
    P("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2),
    P("cuDevicePrimaryCtxGetState", 7000, cuDevicePrimaryCtxGetState),
    P("cuCtxCreate", 2000, cuCtxCreate),
    P("cuCtxCreate", 3020, cuCtxCreate_v2),
    P("cuCtxCreate", 11040, cuCtxCreate_v3),
    P("cuCtxCreate", 12050, cuCtxCreate_v4),
    P("cuCtxDestroy", 2000, cuCtxDestroy),
    P("cuCtxDestroy", 4000, cuCtxDestroy_v2),
    P("cuCtxPushCurrent", 2000, cuCtxPushCurrent),
    P("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2),
    P("cuCtxPopCurrent", 2000, cuCtxPopCurrent),
    P("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
    P("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    P("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    P("cuCtxGetDevice", 2000, cuCtxGetDevice),
    P("cuCtxSynchronize", 2000, cuCtxSynchronize),
    P("cuThreadExchangeStreamCaptureMode", 10010, cuThreadExchangeStreamCaptureMode),
    P("cuGetProcAddress", 11030, cuGetProcAddress),
    P("cuGetProcAddress", 12000, cuGetProcAddress_v2),
    P("cuMemHostRegister", 4000, cuMemHostRegister),
    P("cuMemHostRegister", 6050, cuMemHostRegister_v2),
    P("cuMemHostUnregister", 4000, cuMemHostUnregister),
    P("cuMemHostGetDevicePointer", 3020, cuMemHostGetDevicePointer_v2),
    P("cuMemHostGetFlags", 2030, cuMemHostGetFlags),
    P("cuMemHostAlloc", 2020, cuMemHostAlloc),
    P("cuMemAllocHost", 3020, cuMemAllocHost_v2),
    P("cuMemFreeHost", 2000, cuMemFreeHost),
    P("cuMemAlloc", 3020, cuMemAlloc_v2),
    P("cuMemFree", 3020, cuMemFree_v2),
    P("cuMemGetAddressRange", 3020, cuMemGetAddressRange_v2),
    P("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2),
    P("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2),
    P("cuMemcpyDtoD", 3020, cuMemcpyDtoD_v2),
    P("cuMemcpyHtoDAsync", 3020, cuMemcpyHtoDAsync_v2),
    P("cuMemcpyDtoHAsync", 3020, cuMemcpyDtoHAsync_v2),
    P("cuMemcpy", 4000, cuMemcpy),
    P("cuMemcpy2D", 3020, cuMemcpy2D_v2),
    P("cuMemcpy2DAsync", 3020, cuMemcpy2DAsync_v2),
    P("cuMemcpy2DUnaligned", 3020, cuMemcpy2DUnaligned_v2),
    P("cuMemcpy3D", 3020, cuMemcpy3D_v2),
    P("cuMemcpy3DAsync", 3020, cuMemcpy3DAsync_v2),
    P("cuMemcpyAsync", 4000, cuMemcpyAsync),
    P("cuMemcpyPeer", 4000, cuMemcpyPeer),
    P("cuMemcpyPeerAsync", 4000, cuMemcpyPeerAsync),
    P("cuDeviceCanAccessPeer", 4000, cuDeviceCanAccessPeer),
    P("cuCtxEnablePeerAccess", 4000, cuCtxEnablePeerAccess),
    P("cuCtxDisablePeerAccess", 4000, cuCtxDisablePeerAccess),
    P("cuMemsetD8", 3020, cuMemsetD8_v2),
    P("cuMemsetD8Async", 3020, cuMemsetD8Async),
    P("cuPointerGetAttribute", 4000, cuPointerGetAttribute),
    P("cuPointerGetAttributes", 7000, cuPointerGetAttributes),
    P("cuStreamCreate", 2000, cuStreamCreate),
    P("cuStreamDestroy", 2000, cuStreamDestroy),
    P("cuStreamDestroy", 4000, cuStreamDestroy_v2),
    P("cuStreamSynchronize", 2000, cuStreamSynchronize),
    P("cuStreamQuery", 2000, cuStreamQuery),
    P("cuStreamGetFlags", 5050, cuStreamGetFlags),
    P("cuStreamWaitEvent", 3020, cuStreamWaitEvent),
    P("cuStreamBeginCapture", 10000, cuStreamBeginCapture),
    P("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2),
    P("cuStreamEndCapture", 10000, cuStreamEndCapture),
    P("cuStreamIsCapturing", 10000, cuStreamIsCapturing),
    P("cuGraphInstantiate", 11040, cuGraphInstantiateWithFlags),
    P("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags),
    P("cuGraphLaunch", 10000, cuGraphLaunch),
    P("cuGraphCreate", 10000, cuGraphCreate),
    P("cuGraphAddMemcpyNode", 10000, cuGraphAddMemcpyNode),
    P("cuGraphDestroy", 10000, cuGraphDestroy),
    P("cuGraphExecDestroy", 10000, cuGraphExecDestroy),
    P("cuEventCreate", 2000, cuEventCreate),
    P("cuEventRecord", 2000, cuEventRecord),
    P("cuEventQuery", 2000, cuEventQuery),
    P("cuEventSynchronize", 2000, cuEventSynchronize),
    P("cuEventElapsedTime", 2000, cuEventElapsedTime),
    P("cuEventElapsedTime", 12080, cuEventElapsedTime_v2),
    P("cuEventDestroy", 2000, cuEventDestroy),
    P("cuEventDestroy", 4000, cuEventDestroy_v2),
    P("cuLaunchKernel", 4000, cuLaunchKernel),
    P("cuLaunchHostFunc", 10000, cuLaunchHostFunc),
    P("cuGetErrorString", 6000, cuGetErrorString),
    P("cuGetErrorName", 6000, cuGetErrorName),
};
#undef P
}  // namespace

API CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                         cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
  (void)flags;  // per-thread-stream variants are not distinguished by the sim
  if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  void* best = nullptr;
  bool known = false;
  for (const auto& e : kProcs) {
    if (std::strcmp(e.name, symbol) != 0) continue;
    known = true;
    if (cudaVersion >= e.min_version) best = e.fn;
  }
  if (best == nullptr) {
    if (status)
      *status = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                      : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
  }
  *pfn = best;
  if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}

API CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                      cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, nullptr);
}

// ---------------------------------------------------- sim diagnostics ----
unsigned long simcuda_stale_count(void) { return g().stale_count.load(); }
unsigned long simcuda_checked_pages(void) { return g().checked_pages.load(); }
void simcuda_reset_counters(void) {
  g().stale_count = 0;
  g().checked_pages = 0;
  g().register_calls = 0;
  g().unregister_calls = 0;
}
void simcuda_reload_env(void) {
  ensure_env();
  load_env();
}
int simcuda_stale_detection_enabled(void) {
  std::lock_guard<std::mutex> l(g().mu);
  return pfn_enabled_locked() ? 1 : 0;
}
int simcuda_pinning_enabled(void) {
  std::lock_guard<std::mutex> l(g().mu);
  G& s = g();
  if (s.pin_state < 0) {
    int fd = new_ring();
    if (fd >= 0) {
      G::Ring rg{fd, {}};
      for (unsigned k = kRingSlots; k-- > 0;) rg.free_slots.push_back(k);
      s.rings.push_back(std::move(rg));
      s.pin_state = 1;
    } else {
      std::fprintf(stderr,
                   "simcuda: io_uring page pinning unavailable; stale detection may miss "
                   "a remapped page that got its old frame back\n");
      s.pin_state = 0;
    }
  }
  return s.pin_state == 1 ? 1 : 0;
}
unsigned long simcuda_live_registrations(void) {
  std::lock_guard<std::mutex> l(g().mu);
  unsigned long n = 0;
  for (auto& kv : g().regs) n += kv.second.hostalloc ? 0 : 1;
  return n;
}
unsigned long simcuda_register_calls(void) { return g().register_calls.load(); }
unsigned long simcuda_unregister_calls(void) { return g().unregister_calls.load(); }
int simcuda_device_count(void) {
  ensure_env();
  return g().devices;
}
int simcuda_device_busy(void) {
  return now_ns() < std::max(busy_until(-1), g().barrier_until.load()) ? 1 : 0;
}

}  // extern "C"
