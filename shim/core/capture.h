// capture: the stream captures in progress in this process, as the capture
// hooks (hooks_driver.cc) see them begin and end. lazypin asks it two things:
//  - may its own release synchronize with the GPU first? Not while a capture
//    is in progress in that context: cuCtxSynchronize invalidates it, even
//    from a thread in relaxed mode (measured on the H200, docs/design.md).
//  - would the driver refuse the program's unregister on this thread (900,
//    and invalidate a capture)? Then it is forwarded, not deferred.
//
// Contract: every call is thread-safe and never calls the driver. A program
// that never captures pays one relaxed load (Any()). The table is guarded by
// a tiny lock held for a scan of a few slots, never across a driver call; the
// hooks that change it run inside lazypin (ScopedInsideLazypin), so a signal
// handler on that thread never takes it again. Past kSlots captures at once,
// the extra ones are counted without their details, and every question is
// answered conservatively (a capture in global mode in every context).
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <mutex>

namespace lazypin {

using Context = void*;  // a CUcontext

// CUstreamCaptureMode's values.
enum class CaptureMode : int { kGlobal = 0, kThreadLocal = 1, kRelaxed = 2 };

class CaptureTracker {
 public:
  static constexpr int kSlots = 64;

  // A capture of `stream` in `ctx` by `thread` may begin: call before the
  // driver's begin (so that no release synchronizes meanwhile). Returns a
  // handle for Refused().
  int Begin(uint64_t stream, Context ctx, CaptureMode mode, uint64_t thread);
  // The driver refused the begin with `handle`: it never was in progress.
  void Refused(int handle);
  // The capture of `stream` is over (ended, invalidated then ended, or the
  // driver says the stream is not capturing).
  void Ended(uint64_t stream);

  // Cheap and lock-free: false means no capture is in progress anywhere.
  bool Any() const { return active_.load(std::memory_order_relaxed) != 0; }
  // A capture is in progress in `ctx` (any mode).
  bool InProgress(Context ctx) const;
  // The driver forbids a potentially unsafe call (cuMemHostUnregister) to
  // `thread` whose capture mode is `thread_mode`: a capture in global mode is
  // in progress on any thread, or one not in relaxed mode on this thread
  // (global mode); one not in relaxed mode on this thread (thread-local mode).
  bool ForbidsUnsafeCall(uint64_t thread, CaptureMode thread_mode) const;

 private:
  struct Slot {
    bool used;
    uint64_t stream;
    Context ctx;
    CaptureMode mode;
    uint64_t thread;
  };
  static constexpr int kOverflow = -1;

  mutable std::mutex mu_;
  Slot slots_[kSlots] = {};
  int overflow_ = 0;  // captures in progress without a slot (guarded by mu_)
  std::atomic<int> active_{0};  // captures in progress, slots and overflow
};

// The calling thread, as the tracker names threads.
inline uint64_t CaptureThreadId() { return static_cast<uint64_t>(pthread_self()); }

// The process's tracker (constant-initialized: usable from the first hook).
CaptureTracker& Captures();

}  // namespace lazypin
