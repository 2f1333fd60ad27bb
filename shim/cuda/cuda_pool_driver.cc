// cuda_pool_driver: lazypin's own unregisters through the real driver (see cuda_pool_driver.h).
#include "cuda_pool_driver.h"

#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <memory>
#include <mutex>

#include "capture.h"
#include "cuda.h"
#include "driver_calls.h"
#include "host_alloc_cache.h"
#include "lazypin_thread.h"
#include "mem_watch.h"
#include "page_class.h"
#include "pfn.h"
#include "prefault.h"
#include "real.h"
#include "sys.h"
#include "thread_state.h"

namespace lazypin {

// `make_waiters`: start a waiter for each context found (never in a release).
int OtherDeviceContexts(Context own, Context* out, int max, bool make_waiters);

namespace {

// What the driver keeps for the calling thread (libcuda's thread-local
// blocks, made by a thread's first call) is made now: on a thread of
// lazypin's as it starts, not at its first release, which may come after the
// program lowered its address-space limit. A capture-mode exchange, undone,
// is a call any thread may make.
void MakeDriverThreadState() {
  if (auto exchange = driver::ExchangeCaptureMode()) {
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (exchange(&mode) == CUDA_SUCCESS) exchange(&mode);
  }
}

// A thread of lazypin's that synchronizes one context when asked, so that a
// release can wait for the GPU's work in flight with a deadline: the wait
// itself (cuCtxSynchronize) has none, and on a GPU that never goes idle (a
// persistent kernel) it never returns. Never destroyed.
class ContextIdleWaiter {
 public:
  // `ctx` null: a waiter for the next context that WaiterFor meets (Adopt).
  explicit ContextIdleWaiter(Context ctx) : ctx_(ctx) {
    StartThreadWithSignalsBlocked([this] { Run(); }).detach();
  }
  // Before its first Wait.
  void Adopt(Context ctx) { ctx_.store(ctx, std::memory_order_release); }

  // True once the work in flight in the context when this was called has
  // finished; false at `deadline_ns`, when the synchronize failed or was not
  // made (a capture in progress), or at once when an earlier synchronize has
  // been running for longer than `stuck_ns` (the GPU does not go idle).
  bool Wait(int64_t deadline_ns, int64_t stuck_ns) {
    const int64_t since = busy_since_.load(std::memory_order_acquire);
    if (since != 0 && MonotonicNs() - since > stuck_ns) return false;
    const uint32_t target = requested_.fetch_add(1, std::memory_order_acq_rel) + 1;
    FutexWake(&requested_, 1);
    for (;;) {
      const uint32_t done = done_.load(std::memory_order_acquire);
      // Rounds compared modulo 2^32.
      if (static_cast<int32_t>(done - target) >= 0) return last_ok_.load(std::memory_order_acquire);
      const int64_t left = deadline_ns - MonotonicNs();
      if (left <= 0) return false;
      FutexWait(&done_, done, left);
    }
  }
  Context ctx() const { return ctx_.load(std::memory_order_acquire); }
  // A synchronize has been running for longer than `stuck_ns` (the GPU does not go idle).
  bool Stuck(int64_t stuck_ns) const {
    const int64_t since = busy_since_.load(std::memory_order_acquire);
    return since != 0 && MonotonicNs() - since > stuck_ns;
  }

 private:
  void Run() {
    ScopedInsideLazypin inside;  // its frees and driver calls are lazypin's own
    MakeDriverThreadState();
    auto push = driver::CtxPushCurrent();
    auto pop = driver::CtxPopCurrent();
    auto sync = driver::CtxSynchronize();
    for (;;) {
      const uint32_t wanted = requested_.load(std::memory_order_acquire);
      if (wanted == done_.load(std::memory_order_relaxed)) {
        IdleWait(&requested_, wanted, -1);
        continue;
      }
      // Every request up to `wanted` was made before this synchronize began,
      // so it covers the work each of them found in flight.
      bool ok = false;
      const Context ctx = this->ctx();
      if (push != nullptr && pop != nullptr && sync != nullptr && !Captures().InProgress(ctx) &&
          push(static_cast<CUcontext>(ctx)) == CUDA_SUCCESS) {
        busy_since_.store(MonotonicNs(), std::memory_order_release);
        ok = sync() == CUDA_SUCCESS;
        busy_since_.store(0, std::memory_order_release);
        CUcontext popped;
        pop(&popped);
      }
      last_ok_.store(ok, std::memory_order_release);
      done_.store(wanted, std::memory_order_release);
      FutexWake(&done_, INT_MAX);
    }
  }

  std::atomic<Context> ctx_;
  std::atomic<uint32_t> requested_{0};  // futex: rounds asked for
  std::atomic<uint32_t> done_{0};       // futex: the last round finished
  std::atomic<bool> last_ok_{false};
  std::atomic<int64_t> busy_since_{0};  // when the synchronize in progress began; 0: none
};

// Every context's waiter. Never destroyed: their threads live on.
struct Waiters {
  static constexpr int kMaxContexts = 16;
  std::mutex mu;
  ContextIdleWaiter* waiters[kMaxContexts] = {};
  int count = 0;  // guarded by mu

  // Caller holds mu.
  ContextIdleWaiter* FindLocked(Context ctx) {
    for (int i = 0; i < count; ++i) {
      if (waiters[i]->ctx() == ctx) return waiters[i];
    }
    return nullptr;
  }
};
Waiters& AllWaiters() {
  static Waiters* waiters = new Waiters;
  return *waiters;
}

ContextIdleWaiter* ExistingWaiterFor(Context ctx) {
  Waiters& all = AllWaiters();
  std::lock_guard<std::mutex> lock(all.mu);
  return all.FindLocked(ctx);
}

// The context's waiter (`ctx` null: one started for a context not yet
// seen, which the next new context adopts), started on first use unless one
// waits for adoption; null past Waiters::kMaxContexts.
ContextIdleWaiter* WaiterFor(Context ctx) {
  static constexpr int kMaxContexts = Waiters::kMaxContexts;
  Waiters& all = AllWaiters();
  std::lock_guard<std::mutex> lock(all.mu);
  ContextIdleWaiter** const waiters = all.waiters;
  int& count = all.count;
  if (ContextIdleWaiter* found = all.FindLocked(ctx)) return found;
  if (ctx != nullptr && count > 0 && waiters[count - 1]->ctx() == nullptr) {
    waiters[count - 1]->Adopt(ctx);
    return waiters[count - 1];
  }
  if (count == kMaxContexts) return nullptr;
  // Without memory or a thread for it (a release that makes room after an
  // allocation failed): none, and the release goes ahead without the wait
  // (reported forced), never a throw into the program.
  try {
    waiters[count] = new ContextIdleWaiter(ctx);
  } catch (...) {
    return nullptr;
  }
  return waiters[count++];
}

// One of lazypin's own releases (`release`: an unregister or a host free) of
// something made in `ctx`: waits for the GPU first, then releases with `ctx`
// current and outside any capture.
int ReleaseInContext(Context ctx, ReleaseWait* wait, absl::FunctionRef<int()> release) {
  auto push = driver::CtxPushCurrent();
  auto pop = driver::CtxPopCurrent();
  auto capture_mode = driver::ExchangeCaptureMode();
  // Wait for the GPU first, on this thread: the release's own wait for
  // the device would otherwise stall every other thread's CUDA work
  // (docs/design.md). Not while a capture is in progress in the context:
  // a synchronize would invalidate it.
  const int64_t t0 = MonotonicNs();
  if (wait->after_wait) {
    // The release before it in this batch waited for the same context.
  } else if (ctx != nullptr && Captures().InProgress(ctx)) {
    wait->forced = true;
  } else if (ctx != nullptr) {
    ContextIdleWaiter* waiter = WaiterFor(ctx);
    wait->forced = waiter == nullptr || !waiter->Wait(t0 + kReleaseWaitNs, kReleaseWaitNs);
    // The other devices' work too: the driver's release waits for it
    // (several devices). Only waiters made before (at a register or a kept
    // free): a release may run in a memory hook, which starts no thread.
    if (DeviceCount() > 1) {
      Context others[kMaxDevices];
      const int n = OtherDeviceContexts(ctx, others, kMaxDevices, /*make_waiters=*/false);
      for (int i = 0; i < n; ++i) {
        ContextIdleWaiter* other = ExistingWaiterFor(others[i]);
        if (Captures().InProgress(others[i]) || other == nullptr) {
          wait->forced = true;
          continue;
        }
        // Missed: the bound passed or the GPU does not go idle. A context
        // destroyed meanwhile (its synchronize fails at once) has no work left.
        if (!other->Wait(t0 + kReleaseWaitNs, kReleaseWaitNs) &&
            (MonotonicNs() >= t0 + kReleaseWaitNs || other->Stuck(kReleaseWaitNs)))
          wait->forced = true;
      }
    }
    wait->waited_ns = MonotonicNs() - t0;
  }
  // Not part of any stream capture the program has in progress: in the
  // default (global) mode this thread's unregister would be refused (900)
  // and invalidate another thread's capture (measured on the H200;
  // testapps/capture.cu). Allocators (PyTorch's) do the same.
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  const bool relaxed = capture_mode != nullptr && capture_mode(&mode) == CUDA_SUCCESS;
  // The registration belongs to `ctx`; whichever thread releases, make it current.
  const bool pushed = ctx != nullptr && push != nullptr && pop != nullptr &&
                      push(static_cast<CUcontext>(ctx)) == CUDA_SUCCESS;
  const int result = release();
  if (pushed) {
    CUcontext popped;
    pop(&popped);
  }
  if (relaxed) capture_mode(&mode);
  return result;
}

class CudaPoolDriver final : public PoolDriver {
 public:
  // Opens the maps descriptor that Admit queries and starts the first
  // context's waiter, here rather than in the first register.
  CudaPoolDriver(MemWatch* watch, bool defer_shared, int prefault_threads, bool prefault_huge)
      : watch_(watch), defer_shared_(defer_shared), prefault_{prefault_threads, prefault_huge} {
    HaveProcmapQuery();
    WaiterFor(nullptr);
  }

  PassReason Admit(uintptr_t lo, uintptr_t hi) override {
    if (!defer_shared_ && !Deferrable(ClassifyRange(lo, hi))) return PassReason::kShared;
    if (watch_ != nullptr && !watch_->Watch(lo, hi)) return PassReason::kUnwatched;
    return PassReason::kNone;
  }
  void Release(uintptr_t lo, uintptr_t hi) override {
    if (watch_ != nullptr) watch_->Unwatch(lo, hi);
  }
  // The waiters a release in `ctx` uses: its own and, with several devices,
  // the other devices' (ReleaseInContext).
  void PrepareRelease(Context ctx) override {
    WaiterFor(ctx);
    if (DeviceCount() > 1) {
      Context others[kMaxDevices];
      OtherDeviceContexts(ctx, others, kMaxDevices, /*make_waiters=*/true);
    }
  }
  void PrepareReleasingThread() override { MakeDriverThreadState(); }
  void Prefault(uintptr_t lo, uintptr_t hi, unsigned flags) override {
    if (ShouldPrefault(lo, hi, flags, prefault_.threads)) PrefaultRange(lo, hi, prefault_);
  }
  void DrainChanges(DrainScope scope, absl::FunctionRef<void(uintptr_t, uintptr_t)> changed) override {
    if (watch_ == nullptr) return;
    scope == DrainScope::kReturned ? watch_->DrainReturned(changed) : watch_->Drain(changed);
  }

  int Unregister(uintptr_t ptr, Context ctx, ReleaseWait* wait) override {
    auto unregister = driver::MemHostUnregister();
    if (unregister == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    return ReleaseInContext(ctx, wait, [&] { return int{unregister(reinterpret_cast<void*>(ptr))}; });
  }
  bool ReadFrames(uintptr_t ptr, size_t bytes, std::vector<uint64_t>* frames) override {
    return ReadPageFrames(ptr, bytes, frames);
  }
  int64_t NowNs() override { return MonotonicNs(); }
  int64_t AgeClockNs() override { return CoarseMonotonicNs(); }

 private:
  MemWatch* const watch_;
  const bool defer_shared_;
  const PrefaultOptions prefault_;
};

// The host-allocation cache's frees, made as the pool's unregisters are.
class CudaHostAllocDriver final : public HostAllocDriver {
 public:
  int Free(uintptr_t ptr, Context ctx, ReleaseWait* wait) override {
    auto free_host = driver::MemFreeHost();
    if (free_host == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    return ReleaseInContext(ctx, wait, [&] { return int{free_host(reinterpret_cast<void*>(ptr))}; });
  }
  bool Flags(uintptr_t ptr, unsigned* flags) override {
    auto get_flags = driver::MemHostGetFlags();
    return get_flags != nullptr && get_flags(flags, reinterpret_cast<void*>(ptr)) == CUDA_SUCCESS;
  }
  int64_t NowNs() override { return MonotonicNs(); }
  void Protect(uintptr_t ptr, size_t bytes, bool accessible) override {
    // The system call itself: the mprotect hook is the program's.
    syscall(SYS_mprotect, ptr, bytes, accessible ? PROT_READ | PROT_WRITE : PROT_NONE);
  }
};

}  // namespace

int DeviceCount() {
  static std::atomic<int> count{0};
  int n = count.load(std::memory_order_relaxed);
  if (n > 0) return n;
  auto get = driver::DeviceGetCount();
  if (get == nullptr || get(&n) != CUDA_SUCCESS || n < 1) return 1;
  count.store(n, std::memory_order_relaxed);
  return n;
}

Context ActivePrimaryContext(int device) {
  auto state = driver::PrimaryCtxGetState();
  auto retain = driver::PrimaryCtxRetain();
  auto release = driver::PrimaryCtxRelease();
  if (state == nullptr || retain == nullptr || release == nullptr) return nullptr;
  unsigned flags = 0;
  int active = 0;
  if (state(device, &flags, &active) != CUDA_SUCCESS || active == 0) return nullptr;
  CUcontext primary = nullptr;
  if (retain(&primary, device) != CUDA_SUCCESS) return nullptr;
  release(device);
  return primary;
}

int OtherDeviceContexts(Context own, Context* out, int max, bool make_waiters) {
  const int devices = DeviceCount();
  if (devices < 2) return 0;
  auto ctx_device = driver::CtxGetDevice();
  CUdevice own_device = -1;
  if (ctx_device != nullptr && own != nullptr) {
    auto push = driver::CtxPushCurrent();
    auto pop = driver::CtxPopCurrent();
    if (push != nullptr && pop != nullptr && push(static_cast<CUcontext>(own)) == CUDA_SUCCESS) {
      if (ctx_device(&own_device) != CUDA_SUCCESS) own_device = -1;
      CUcontext popped;
      pop(&popped);
    }
  }
  int n = 0;
  for (int d = 0; d < devices && d < kMaxDevices && n < max; ++d) {
    if (d == own_device) continue;
    const Context primary = ActivePrimaryContext(d);
    if (primary == nullptr || primary == own) continue;
    if (make_waiters) WaiterFor(primary);
    out[n++] = primary;
  }
  // And every other context lazypin has a waiter for (it saw a registration,
  // a kept free or a wait there: contexts made with cuCtxCreate too, on any
  // device). One destroyed since fails its push: nothing to wait for.
  Waiters& all = AllWaiters();
  std::lock_guard<std::mutex> lock(all.mu);
  for (int i = 0; i < all.count && n < max; ++i) {
    const Context c = all.waiters[i]->ctx();
    if (c == nullptr || c == own || std::find(out, out + n, c) != out + n) continue;
    out[n++] = c;
  }
  return n;
}

int OtherDeviceContexts(Context own, Context* out, int max) {
  return OtherDeviceContexts(own, out, max, /*make_waiters=*/true);
}

std::unique_ptr<PoolDriver> MakeCudaPoolDriver(MemWatch* watch, bool defer_shared,
                                               int prefault_threads, bool prefault_huge) {
  return std::make_unique<CudaPoolDriver>(watch, defer_shared, prefault_threads, prefault_huge);
}

std::unique_ptr<HostAllocDriver> MakeCudaHostAllocDriver() {
  return std::make_unique<CudaHostAllocDriver>();
}

}  // namespace lazypin
