// collector: the background thread (see collector.h).
#include "collector.h"

#include <linux/futex.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>

#include "capture.h"
#include "glibc_blocks.h"
#include "host_alloc_cache.h"
#include "lazypin_thread.h"
#include "memory_budget.h"
#include "pool.h"
#include "sys.h"
#include "thread_state.h"

namespace lazypin {
namespace {

int64_t MonotonicMs() { return MonotonicNs() / 1000000; }

}  // namespace

Collector::Slot* Collector::ZeroedSlots() {
  void* p = mmap(nullptr, sizeof(Slot) * kSlots, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return new Slot[kSlots];  // never unmapped nor deleted: the collector stays
  return static_cast<Slot*>(p);
}

Collector::Collector(Pool* pool, int64_t idle_ms, FreeFn real_free, FreeBounds bounds,
                     const CaptureTracker* captures, HostAllocCache* host_cache,
                     MemoryBudget* budget)
    : pool_(pool),
      host_cache_(host_cache),
      idle_ms_(idle_ms),
      real_free_(real_free),
      bounds_(bounds),
      slots_(ZeroedSlots()),
      captures_(captures),
      budget_(budget) {
  thread_ = StartThreadWithSignalsBlocked([this] { Run(); });
}

bool Collector::TakeFree(void* block, size_t bytes, bool may_wait, bool glibc_freed) {
  const uint64_t ticket = HandOver(block, bytes, glibc_freed);
  if (ticket == 0) return false;
  if (may_wait && PendingBytes() > bounds_.max_pending_bytes) {
    WaitFreed(ticket, bounds_.pending_wait_ms);
  }
  return true;
}

uint64_t Collector::HandOver(void* block, size_t bytes, bool glibc_freed) {
  if (stopping_.load(std::memory_order_acquire)) return 0;
  const uintptr_t address = reinterpret_cast<uintptr_t>(block);
  if (address <= kClaimed) return 0;
  const size_t start = next_slot_.fetch_add(1, std::memory_order_relaxed);
  for (size_t i = 0; i < kSlots; ++i) {
    Slot& slot = slots_[(start + i) % kSlots];
    uintptr_t expected = 0;
    if (slot.block.load(std::memory_order_relaxed) != 0 ||
        !slot.block.compare_exchange_strong(expected, kClaimed, std::memory_order_acquire,
                                            std::memory_order_relaxed)) {
      continue;
    }
    slot.bytes.store(bytes, std::memory_order_relaxed);
    slot.glibc_freed.store(glibc_freed, std::memory_order_relaxed);
    pending_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    slot.block.store(address, std::memory_order_release);
    const uint64_t ticket = handed_.fetch_add(1, std::memory_order_acq_rel) + 1;
    Wake();
    return ticket;
  }
  return 0;  // every slot taken: the caller handles this free
}

bool Collector::WaitFreed(uint64_t ticket, int64_t timeout_ms) {
  const int64_t deadline = MonotonicMs() + timeout_ms;
  for (;;) {
    const uint32_t seen = finished_.load(std::memory_order_acquire);
    // Tickets compared modulo 2^32: the futex word holds the low bits.
    if (static_cast<int32_t>(seen - static_cast<uint32_t>(ticket)) >= 0) return true;
    const int64_t left = deadline - MonotonicMs();
    if (left <= 0) return false;
    FutexWait(&finished_, seen, left * 1000000);
  }
}

void Collector::FreeBlock(uintptr_t address, bool glibc_freed) const {
  if (glibc_freed) {
    GlibcUnmapChunk(reinterpret_cast<const void*>(address));
  } else {
    real_free_(reinterpret_cast<void*>(address));
  }
}

Collector::Again Collector::FreedAgain(const void* block, int64_t timeout_ms) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(block);
  for (size_t i = 0; i < kSlots; ++i) {
    Slot& slot = slots_[i];
    uintptr_t expected = address;
    if (slot.block.load(std::memory_order_seq_cst) != address) continue;
    if (slot.block.compare_exchange_strong(expected, kClaimed, std::memory_order_seq_cst)) {
      const size_t bytes = slot.bytes.load(std::memory_order_relaxed);
      pool_->MarkLeft(address, address + bytes);
      pool_->Invalidate(address, address + bytes, EvictReason::kFree);
      FreeBlock(address, slot.glibc_freed.load(std::memory_order_relaxed));
      pending_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
      slot.block.store(0, std::memory_order_release);
      return Again::kDone;
    }
    // The thread took it meanwhile: it frees it.
    return WaitHandedFrees(timeout_ms) ? Again::kDone : Again::kTimedOut;
  }
  if (busy_block_.load(std::memory_order_seq_cst) == address) {  // the thread is freeing it
    return WaitHandedFrees(timeout_ms) ? Again::kDone : Again::kTimedOut;
  }
  return Again::kNotPending;
}

bool Collector::ReleaseParked(int64_t timeout_ms) {
  if (stopping_.load(std::memory_order_acquire)) return false;
  const uint32_t ticket = release_asked_.fetch_add(1, std::memory_order_acq_rel) + 1;
  Wake();
  return WaitDone(release_done_, ticket, timeout_ms);
}

bool Collector::MakeRoom(uint64_t headroom, int64_t timeout_ms) {
  if (stopping_.load(std::memory_order_acquire) || budget_ == nullptr) return false;
  uint64_t asked = room_target_.load(std::memory_order_relaxed);
  while (asked < headroom &&
         !room_target_.compare_exchange_weak(asked, headroom, std::memory_order_relaxed)) {
  }
  const uint32_t ticket = room_asked_.fetch_add(1, std::memory_order_acq_rel) + 1;
  Wake();
  return WaitDone(room_done_, ticket, timeout_ms);
}

bool Collector::WaitDone(const std::atomic<uint32_t>& done_word, uint32_t ticket,
                         int64_t timeout_ms) {
  const int64_t deadline = MonotonicMs() + timeout_ms;
  for (;;) {
    const uint32_t done = done_word.load(std::memory_order_acquire);
    if (static_cast<int32_t>(done - ticket) >= 0) return true;
    const int64_t left = deadline - MonotonicMs();
    if (left <= 0 || stopping_.load(std::memory_order_acquire)) return false;
    FutexWait(&done_word, done, left * 1000000);
  }
}

uint64_t Collector::PollTarget() const {
  uint64_t kept = pool_->Counters().parked_bytes;
  if (host_cache_ != nullptr) kept += host_cache_->Counters().cached_bytes;
  return budget_->margin() + kept;
}

void Collector::Yield(uint64_t headroom) {
  // 0: the poll's target, which shrinks with each release.
  while (budget_->ShortOf(headroom != 0 ? headroom : PollTarget()) > 0) {
    if (host_cache_ != nullptr && host_cache_->ReleaseOldest(EvictReason::kPressure)) continue;
    if (pool_->ReleaseOldestParked(EvictReason::kPressure)) continue;
    // Nothing kept is left and the headroom is under the margin itself:
    // deferred registrations add no bytes, but their pages are pinned
    // (never swapped, migrated or compacted).
    if (budget_->ShortOf(budget_->margin()) > 0) {
      pool_->CollectIdle(kPressureIdleMs * 1000000, EvictReason::kPressure);
    }
    return;
  }
}

void Collector::Wake() {
  wake_seq_.fetch_add(1, std::memory_order_release);
  FutexWake(&wake_seq_, 1);
}

void Collector::FinishFrees() {
  const uint64_t upto = handed_.load(std::memory_order_acquire);
  // A block published after the last scan has a later ticket (taken after it
  // was published, then a Wake): nothing new to take until `handed_` moves.
  if (upto == scanned_upto_) return;
  scanned_upto_ = upto;
  for (size_t i = 0; i < kSlots; ++i) {
    Slot& slot = slots_[i];
    const uintptr_t address = slot.block.load(std::memory_order_acquire);
    if (address <= kClaimed) continue;  // free, or a HandOver still filling it (a later ticket)
    // Named as being freed before its slot stops naming it, so that a second
    // free of it always finds one of the two (FreedAgain).
    busy_block_.store(address, std::memory_order_seq_cst);
    uintptr_t expected = address;
    if (!slot.block.compare_exchange_strong(expected, kClaimed, std::memory_order_seq_cst)) {
      busy_block_.store(0, std::memory_order_seq_cst);
      continue;  // taken back by a second free of the block (FreedAgain)
    }
    const size_t bytes = slot.bytes.load(std::memory_order_relaxed);
    const bool glibc_freed = slot.glibc_freed.load(std::memory_order_relaxed);
    slot.block.store(0, std::memory_order_release);  // free again: a HandOver may take it
    pool_->MarkLeft(address, address + bytes);  // done already unless the free found the lock busy
    pool_->Invalidate(address, address + bytes, EvictReason::kFree);
    FreeBlock(address, glibc_freed);
    busy_block_.store(0, std::memory_order_seq_cst);
    pending_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
  }
  if (static_cast<int32_t>(static_cast<uint32_t>(upto) -
                           finished_.load(std::memory_order_relaxed)) > 0) {
    finished_.store(static_cast<uint32_t>(upto), std::memory_order_release);
    FutexWake(&finished_, INT32_MAX);
  }
}

void Collector::Stop() {
  if (stopping_.exchange(true, std::memory_order_acq_rel)) return;
  Wake();
  if (thread_.joinable()) thread_.join();
  ScopedInsideLazypin inside;
  FinishFrees();  // handed over before `stopping_` was seen
}

bool Collector::PostponedForCapture(int64_t now_ms) {
  if (captures_ == nullptr || !captures_->Any()) {
    postponed_since_ms_ = 0;
    return false;
  }
  if (postponed_since_ms_ == 0) postponed_since_ms_ = now_ms;
  // Past the bound, releases go ahead until no capture is seen again, so that
  // captures back to back cannot hold them off for longer.
  return now_ms - postponed_since_ms_ < bounds_.capture_postpone_ms;
}

void Collector::Run() {
  ScopedInsideLazypin inside;  // its frees and the driver's are ours: pass them through
  // The thread's allocator arena is made now, not first when an allocation
  // has just failed for want of memory and this thread is to make room.
  free(malloc(64));
  pool_->PrepareReleasingThread();
  const int64_t period_ms = std::clamp<int64_t>(idle_ms_ / 4, 10, 1000);
  int64_t next_collect_ms = MonotonicMs() + period_ms;
  // The pool's filter tables are faulted in here, not by the program's first
  // deferrals; 10 ms after the start, not beside the program's first call
  // (which set lazypin up and is still registering).
  const int64_t prefault_ms = MonotonicMs() + 10;
  bool prefaulted = false;
  while (!stopping_.load(std::memory_order_acquire)) {
    if (!prefaulted && MonotonicMs() >= prefault_ms) {
      pool_->Prefault();
      prefaulted = true;
    }
    const uint32_t seq = wake_seq_.load(std::memory_order_acquire);
    const uint64_t seen_handed = handed_.load(std::memory_order_acquire);
    if (PostponedForCapture(MonotonicMs())) {
      // Look again soon: the capture's end is not signalled.
      IdleWait(&wake_seq_, seq, 2 * 1000000);
      continue;
    }
    FinishFrees();
    if (const uint32_t asked = release_asked_.load(std::memory_order_acquire);
        asked != release_done_.load(std::memory_order_relaxed)) {
      pool_->ReleaseParked(EvictReason::kMakeRoom);
      release_done_.store(asked, std::memory_order_release);
      FutexWake(&release_done_, INT32_MAX);
    }
    if (const uint32_t asked = room_asked_.load(std::memory_order_acquire);
        asked != room_done_.load(std::memory_order_relaxed)) {
      Yield(std::max(room_target_.exchange(0, std::memory_order_relaxed), budget_->margin()));
      room_done_.store(asked, std::memory_order_release);
      FutexWake(&room_done_, INT32_MAX);
    }
    pool_->ApplyPageChanges();  // stale registrations go even while the program makes no call
    int64_t wait_ms = 1000;
    // While anything is kept: the headroom every kPollMs.
    bool polling = false;
    int64_t poll_ms = MemoryBudget::kPollMs;
    if (budget_ != nullptr) {
      const int64_t now_ms = MonotonicMs();
      const bool kept = budget_->TakeKeptSignal() || budget_->Keeping();
      if (kept) kept_seen_ms_ = now_ms;
      polling = kept_seen_ms_ != 0 && now_ms - kept_seen_ms_ < kPollGraceMs;
      budget_->SetPolling(polling);
      if (kept && budget_->ShortOf(PollTarget()) > 0) Yield(0);
      poll_ms = kept ? budget_->PollIntervalMs(PollTarget()) : MemoryBudget::kPollMs;
    }
    if (idle_ms_ > 0) {
      const int64_t now_ms = MonotonicMs();
      if (now_ms >= next_collect_ms) {
        pool_->CollectIdle(idle_ms_ * 1000000);
        if (host_cache_ != nullptr) host_cache_->CollectIdle(idle_ms_ * 1000000);
        next_collect_ms = now_ms + period_ms;
      }
      wait_ms = std::max<int64_t>(next_collect_ms - now_ms, 1);
    }
    if (!prefaulted) wait_ms = std::min<int64_t>(wait_ms, 10);
    if (polling) wait_ms = std::min<int64_t>(wait_ms, poll_ms);
    int64_t wait_ns = wait_ms * 1000000;
    if (const int64_t now_ns = MonotonicNs(); now_ns >= zero_next_ns_) {
      const size_t wrote = pool_->ZeroParkedStep(kZeroStepBytes);
      const int64_t after_ns = MonotonicNs();
      zero_next_ns_ = wrote != 0 ? after_ns + (after_ns - now_ns) * kZeroPauseFactor : 0;
    }
    if (zero_next_ns_ != 0) {
      wait_ns = std::clamp<int64_t>(zero_next_ns_ - MonotonicNs(), 1000, wait_ns);
    }
    if (handed_.load(std::memory_order_acquire) != seen_handed) continue;  // more came meanwhile
    if (release_asked_.load(std::memory_order_acquire) !=
            release_done_.load(std::memory_order_relaxed) ||
        room_asked_.load(std::memory_order_acquire) != room_done_.load(std::memory_order_relaxed)) {
      continue;  // asked meanwhile
    }
    IdleWait(&wake_seq_, seq, wait_ns);
  }
}

}  // namespace lazypin
