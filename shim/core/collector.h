// collector: lazypin's background thread. It does two things the program's
// threads must not wait for:
//  - frees of pooled memory (hooks_memory hands them over, async-signal-safe):
//    it unregisters the pooled registration, then frees the block. The free
//    hook thus never calls the driver, so a free() from a signal handler that
//    interrupted the CUDA driver cannot re-enter it, and a free of pooled
//    memory never waits for an unregister stalled by a busy GPU.
//  - releases pooled registrations left unused for LAZYPIN_IDLE_MS. It never
//    releases more than the program itself unregistered (each pooled entry
//    stands for one unregister the program asked for and lazypin postponed),
//    so it adds no stall the program would not have had.
//  - makes kept memory yield to the program's demand (memory_budget.h): while
//    anything is kept it reads the headroom every MemoryBudget::PollIntervalMs and,
//    when it falls short (or an allocation asks, MakeRoom), releases kept
//    memory, least recently kept first: host blocks, then parked blocks, then
//    deferred registrations unused for kPressureIdleMs (their pages are pinned).
//  - zeroes parked blocks ahead of their reuse (Pool::ZeroParkedStep), so that
//    an allocation served one does not zero it on the program's thread: in
//    steps of kZeroStepBytes, each followed by a pause kZeroPauseFactor times
//    as long as the step took. So zeroing takes at most 2% of this thread's
//    time, and of the memory bandwidth one core's streaming stores can use.
// Both wait while a stream capture is in progress (CaptureTracker), at most
// FreeBounds::capture_postpone_ms, so that their releases can wait for the
// GPU first (a synchronize would invalidate the capture); past the bound
// they go ahead without that wait (forced).
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

#include "lazypin_thread.h"
#include "thread_state.h"

namespace lazypin {

class Pool;
class HostAllocCache;
class MemoryBudget;

// What the program freed must not pile up (a program that frees 40 GiB and
// allocates 40 GiB again would need both): past `max_pending_bytes` handed
// over and not yet freed, a free waits for its block, as it would if it
// unregistered inline. Bounded (`pending_wait_ms`), so that a signal handler's
// free that interrupted the driver (which the collector then waits for) is
// only delayed.
struct FreeBounds {
  uint64_t max_pending_bytes = uint64_t{64} << 20;
  int64_t pending_wait_ms = 2000;
  int64_t capture_postpone_ms = 1000;
};

class CaptureTracker;

class Collector {
 public:
  using FreeFn = void (*)(void*);
  // Starts the thread (all signals blocked in it). `real_free` frees a block
  // without lazypin's hook; `idle_ms` 0 turns idle release off; `captures`
  // null: releases never wait for captures. `host_cache` (may be null): its
  // blocks cached for `idle_ms` are freed too. `budget` (may be null): kept
  // memory yields to the program (see above).
  Collector(Pool* pool, int64_t idle_ms, FreeFn real_free, FreeBounds bounds = {},
            const CaptureTracker* captures = nullptr, HostAllocCache* host_cache = nullptr,
            MemoryBudget* budget = nullptr);
  Collector(const Collector&) = delete;
  Collector& operator=(const Collector&) = delete;

  // The program frees a block of `bytes` that overlaps pooled memory: hands
  // it over (HandOver), and with `may_wait` waits for it within FreeBounds.
  // False when stopping or when every slot is taken: the caller then handles
  // the free itself. `glibc_freed`: glibc saw the block's free already (an
  // mmapped chunk's stand-in, GlibcStandInFor): it is unmapped, not freed.
  // Async-signal-safe.
  bool TakeFree(void* block, size_t bytes, bool may_wait, bool glibc_freed = false);

  // Async-signal-safe, lock-free: takes over a malloc'd block of `bytes`
  // that overlaps pooled memory; the thread invalidates, then frees it. The
  // block itself is never written: it is recorded in a slot of lazypin's own
  // (allocators keep blocks of 1 or 8 bytes side by side, and some write
  // their own free lists into freed blocks). Returns a ticket for WaitFreed;
  // 0 once stopping or when all kSlots slots are taken (the caller frees it
  // itself). One racing with Stop() may stay unfreed: a leak at exit, never a
  // stale registration.
  uint64_t HandOver(void* block, size_t bytes, bool glibc_freed = false);
  // Waits until the block with `ticket` is freed, at most `timeout_ms`.
  // Async-signal-safe (a futex); false on timeout.
  bool WaitFreed(uint64_t ticket, int64_t timeout_ms);
  // An allocation failed while parked blocks (Pool::Park) held memory: the
  // thread releases them all (it may call the driver; the caller may be
  // inside it) and this waits for that, at most `timeout_ms`. False on
  // timeout or once stopping. Never from the collector's own thread.
  bool ReleaseParked(int64_t timeout_ms);
  // An allocation needs `headroom` bytes free (MemoryBudget::Announce): the
  // thread releases kept memory until the headroom reaches it or nothing is
  // kept, and this waits for that, at most `timeout_ms`. False on timeout or
  // once stopping. Never from the collector's own thread.
  bool MakeRoom(uint64_t headroom, int64_t timeout_ms);
  // Wakes the thread (something started being kept). Async-signal-safe.
  void Nudge() { Wake(); }
  // The thread keeps polling this long after it last saw anything kept.
  static constexpr int64_t kPollGraceMs = 1000;
  // Deferred registrations unused this long are released under pressure.
  static constexpr int64_t kPressureIdleMs = 1000;
  // Zeroing ahead (see above).
  static constexpr size_t kZeroStepBytes = size_t{256} << 10;
  static constexpr int64_t kZeroPauseFactor = 49;
  // `block` is freed again while its first free is still handed over (the
  // program's double free)? If so, that first free is made before this
  // returns: taken back from its slot and made on this thread (invalidated,
  // then freed), so that glibc's free then meets the second one as without
  // lazypin (its tcache check looks at the freeing thread's cache only), or,
  // when the thread has it already, waited for (at most `timeout_ms`).
  // Scans the slots (only frees of pooled memory get here). Call inside
  // lazypin's code (ScopedInsideLazypin), never from a signal handler that
  // interrupted it.
  enum class Again { kNotPending, kDone, kTimedOut };
  Again FreedAgain(const void* block, int64_t timeout_ms);
  // Waits until every free handed over so far is done, at most `timeout_ms`
  // (false on timeout). Async-signal-safe (a futex).
  bool WaitHandedFrees(int64_t timeout_ms) {
    return WaitFreed(handed_.load(std::memory_order_acquire), timeout_ms);
  }
  // Bytes handed over and not yet freed.
  uint64_t PendingBytes() const { return pending_bytes_.load(std::memory_order_relaxed); }
  // Stops and joins the thread, then finishes the frees handed over.
  void Stop();

  // Frees handed over and not yet taken by the thread, at most (a stalled
  // driver holds them; each costs 16 bytes here, none in the block).
  static constexpr size_t kSlots = 4096;

  // The headroom the poll keeps while anything is kept: the margin plus
  // everything kept. Releasing takes time (the driver unpins a freed host
  // block: 455 ms for 3.5 GiB on the H200), during which a program touching
  // memory it mapped earlier grows unannounced; starting that early lets a
  // program growing at up to (kept / release time) lose nothing to lazypin.
  uint64_t PollTarget() const;

 private:
  // One pending free: `block` is 0 (free), kClaimed (being filled by a
  // HandOver) or the block's address (published, `bytes` valid).
  struct Slot {
    std::atomic<uintptr_t> block{0};
    std::atomic<size_t> bytes{0};
    std::atomic<bool> glibc_freed{false};
  };
  // The free of a slot's block, once its registration is gone.
  void FreeBlock(uintptr_t address, bool glibc_freed) const;
  static constexpr uintptr_t kClaimed = 1;
  // The block the thread is freeing now (taken from its slot), or 0.
  std::atomic<uintptr_t> busy_block_{0};
  static Slot* ZeroedSlots();
  void Run();
  // True while releases wait for a capture in progress to end (within the bound).
  bool PostponedForCapture(int64_t now_ms);
  void FinishFrees();
  // Releases kept memory, least recently kept first, until the headroom is
  // `headroom` (0: PollTarget(), read again after each release) or nothing
  // kept is left; then, if the headroom is still under the margin itself,
  // deferred registrations unused for kPressureIdleMs.
  void Yield(uint64_t headroom);
  bool WaitDone(const std::atomic<uint32_t>& done, uint32_t ticket, int64_t timeout_ms);
  void Wake();

  Pool* const pool_;
  HostAllocCache* const host_cache_;
  const int64_t idle_ms_;
  const FreeFn real_free_;
  const FreeBounds bounds_;
  // kSlots slots in a zeroed anonymous mapping (zero is the empty slot),
  // touched only as they are used: none is written when the collector is made
  // (at set-up).
  Slot* const slots_;
  std::atomic<size_t> next_slot_{0};  // where the next HandOver starts looking
  const CaptureTracker* const captures_;
  int64_t postponed_since_ms_ = 0;  // the collector thread's: 0 when no capture was seen
  int64_t kept_seen_ms_ = 0;        // the collector thread's: when it last saw anything kept
  int64_t zero_next_ns_ = 0;        // the collector thread's: the next zeroing step (0: none due)
  std::atomic<uint32_t> wake_seq_{0};  // a futex: bumped by Wake()
  // Tickets: a block's ticket is taken after its slot is published, so every
  // ticket up to a value read before a scan of the slots is in that scan.
  std::atomic<uint64_t> handed_{0};
  uint64_t scanned_upto_ = 0;  // `handed_` at the last scan (the thread's, then Stop's)
  std::atomic<uint32_t> finished_{0};  // a futex: the last ticket freed (low 32 bits)
  std::atomic<uint64_t> pending_bytes_{0};
  // ReleaseParked requests (a futex each): asked, and the last one done.
  std::atomic<uint32_t> release_asked_{0};
  std::atomic<uint32_t> release_done_{0};
  // MakeRoom requests: the largest headroom asked, and a futex pair as above.
  MemoryBudget* const budget_;
  std::atomic<uint64_t> room_target_{0};
  std::atomic<uint32_t> room_asked_{0};
  std::atomic<uint32_t> room_done_{0};
  std::atomic<bool> stopping_{false};
  LazypinThread thread_;
};

}  // namespace lazypin
