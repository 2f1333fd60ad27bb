// fork_fence: a process copy made without fork() (syscall(SYS_fork),
// clone() without CLONE_VM, _Fork()) runs no atfork handler, so glibc's
// allocator locks are copied as they are: one that a thread held then stays
// held in the child for good. The program's own threads are the program's
// affair (the same copy made bare has them); lazypin's threads are not, so
// each of their allocator calls passes the fence (Pass), and the hook that
// makes such a copy closes it first (Close): it waits until none of lazypin's
// threads is inside the allocator, and those that arrive meanwhile wait
// until the copy is made (Open).
//
// A pass lasts one real allocator call (microseconds); a closer waits at
// most kCloseWaitNs for the passes under way, then makes the copy anyway.
// Async-signal-safe: futex waits and atomics only, no allocation.
#pragma once

#include <errno.h>

#include <atomic>
#include <cstdint>

#include "sys.h"

namespace lazypin {

class ForkFence {
 public:
  static constexpr int64_t kCloseWaitNs = 100 * 1000 * 1000;

  // One of lazypin's threads around one real allocator call.
  class Pass {
   public:
    Pass() { Enter(); }
    ~Pass() { Leave(); }
    Pass(const Pass&) = delete;
    Pass& operator=(const Pass&) = delete;
  };

  // The copying thread, around the real call that makes the copy; Open runs
  // in the parent (a copy starts with no thread of lazypin's) and leaves
  // errno as the copy's call set it.
  static void Close();
  static void Open();
  // In a copy, whatever the copy was made through: no pass, no closer.
  static void ResetInCopy() { word_.store(0, std::memory_order_relaxed); }

 private:
  // Low 16 bits: passes under way; high 16 bits: closers.
  static constexpr uint32_t kCloser = uint32_t{1} << 16;
  static constexpr uint32_t kPassMask = kCloser - 1;
  static inline std::atomic<uint32_t> word_{0};

  static void Enter();
  static void Leave();
};

inline void ForkFence::Enter() {
  uint32_t seen = word_.load(std::memory_order_relaxed);
  for (;;) {
    if (seen >= kCloser) {
      FutexWait(&word_, seen);
      seen = word_.load(std::memory_order_relaxed);
    } else if (word_.compare_exchange_weak(seen, seen + 1, std::memory_order_acquire,
                                           std::memory_order_relaxed)) {
      return;
    }
  }
}

inline void ForkFence::Leave() {
  const uint32_t now = word_.fetch_sub(1, std::memory_order_release) - 1;
  if (now >= kCloser && (now & kPassMask) == 0) FutexWake(&word_, INT32_MAX);
}

inline void ForkFence::Close() {
  uint32_t seen = word_.fetch_add(kCloser, std::memory_order_acquire) + kCloser;
  const int64_t deadline = MonotonicNs() + kCloseWaitNs;
  while ((seen & kPassMask) != 0) {
    const int64_t left = deadline - MonotonicNs();
    if (left <= 0) return;
    FutexWait(&word_, seen, left);
    seen = word_.load(std::memory_order_acquire);
  }
}

inline void ForkFence::Open() {
  const int saved_errno = errno;
  word_.fetch_sub(kCloser, std::memory_order_release);
  FutexWake(&word_, INT32_MAX);
  errno = saved_errno;
}

}  // namespace lazypin
