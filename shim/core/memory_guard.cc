// memory_guard: invalidation before memory leaves the process (see memory_guard.h).
#include "memory_guard.h"

#include <malloc.h>
#include <sys/mman.h>

#include "collector.h"
#include "glibc_blocks.h"
#include "memory_budget.h"
#include "pages.h"
#include "thread_state.h"

namespace lazypin {

void MemoryGuard::Leaving(uintptr_t lo, uintptr_t hi, EvictReason reason) const {
  // A block the program gave back with cudaFreeHost is the driver's mapping
  // while lazypin keeps it: unmapping it (a use after free) must not leave the
  // driver a mapping to free later at an address that may be reused. Free it
  // first; the program's call then acts on an unmapped range, as without lazypin.
  // realloc and brk give back heap memory, never a driver mapping: no lookup.
  if (t_state.inside == 0 && reason != EvictReason::kRealloc && reason != EvictReason::kBrk &&
      HostHolding() && !LeftProcess()) {
    ScopedInsideLazypin inside;
    host_cache_->Invalidate(lo, hi, reason);
  }
  // One of lazypin's own threads: this comes from an allocator's own code
  // that it called (jemalloc purges with madvise on whichever thread
  // allocates), where a driver call could allocate inside that allocator.
  // The kernel watch sees these pages go (applied at the next pool call).
  if (t_state.inside > 0 || t_own_thread || !pool_->MaybeTracks(lo, hi) || LeftProcess()) {
    return;
  }
  ScopedInsideLazypin inside;
  pool_->MarkLeft(lo, hi);
  pool_->Invalidate(lo, hi, reason);
}

void MemoryGuard::Protecting(uintptr_t lo, uintptr_t hi, int prot) const {
  constexpr int kReadWrite = PROT_READ | PROT_WRITE;
  if ((prot & kReadWrite) != kReadWrite) {
    Leaving(lo, hi, EvictReason::kMprotect);
  } else {
    Touching(lo, hi, EvictReason::kMprotect);
  }
}

void MemoryGuard::Touching(uintptr_t lo, uintptr_t hi, EvictReason reason) const {
  if (t_state.inside == 0 && HostHolding() && !LeftProcess()) {
    ScopedInsideLazypin inside;
    host_cache_->Invalidate(lo, hi, reason);
  }
}

void MemoryGuard::Reclaiming(uintptr_t lo, uintptr_t hi) const {
  Touching(lo, hi, EvictReason::kMemoryCall);
  if (t_state.inside > 0 || t_own_thread || LeftProcess()) return;
  // Frees handed to the collector and not yet made: made first (the block
  // may be there), as without lazypin the free was made when it returned.
  constexpr int64_t kWaitMs = 2000;
  if (collector_ != nullptr && collector_->PendingBytes() != 0) collector_->WaitHandedFrees(kWaitMs);
  if (!reuse_ || !pool_->MaybeHolds(lo, hi)) return;
  ScopedInsideLazypin inside;
  pool_->ReleaseParked(EvictReason::kMmapFixed, lo, hi);
}

void MemoryGuard::YieldingWatch(uintptr_t lo, uintptr_t hi) const {
  if (t_state.inside > 0 || t_own_thread || !pool_->MaybeTracks(lo, hi) || LeftProcess()) {
    return;
  }
  ScopedInsideLazypin inside;
  pool_->YieldWatch(lo, hi, EvictReason::kUserfaultfd);
}

size_t MemoryGuard::BlockBytes(const void* block) const {
  // glibc's own checks first, on the header words its free reads first: a
  // pointer it rejects is left for it to reject, where malloc_usable_size
  // would read further (the next chunk's header) and fault first.
  if (glibc_) return GlibcChunkOf(block, PageSize()).usable;
  return malloc_usable_size(const_cast<void*>(block));
}

bool MemoryGuard::Parkable(const void* block) {
  const GlibcChunk chunk = GlibcChunkOf(block, PageSize());
  return chunk.servable && (!chunk.mmapped || (chunk.usable + 16 >= GlibcMmapFloorNow() &&
                                               !GlibcFreeMovesThreshold(chunk.usable + 16)));
}

bool MemoryGuard::TakeFree(void* block) const {
  if (!pool_->Tracking()) return false;  // Holding() only for the host cache's blocks
  const uintptr_t lo = reinterpret_cast<uintptr_t>(block);
  const size_t bytes = BlockBytes(block);
  if (bytes == 0 || !pool_->MaybeTracks(lo, lo + bytes) || LeftProcess()) return false;
  if (t_state.inside > 0) {
    // lazypin's own code is running on this thread (and may hold the pool's
    // lock), so this free comes from it (never pooled memory) or from a
    // signal handler that interrupted it: queue it for when lazypin's code
    // returns, or hand it to the collector without waiting. With neither
    // (exit, the queue and the collector's slots full): a leak, never a stale
    // registration. No wait for a slot either: the collector frees slots by
    // invalidating, which takes the pool's lock, which this thread may hold.
    if (t_state.queued_free_count < ThreadState::kQueuedFrees) {
      t_state.queued_frees[t_state.queued_free_count++] = block;
    } else if (collector_ != nullptr) {
      collector_->TakeFree(block, bytes, /*may_wait=*/false);
    }
    return true;
  }
  // A second free of a block whose first free lazypin holds (handed over, or
  // parked below): the first is made glibc's, on this thread, before this one
  // reaches glibc's free, which then fails as without lazypin ("double free
  // detected": its tcache check looks at the freeing thread's cache).
  constexpr int64_t kDoubleFreeWaitMs = 2000;
  if (collector_ != nullptr && collector_->PendingBytes() != 0) {
    ScopedInsideLazypin inside;
    switch (collector_->FreedAgain(block, kDoubleFreeWaitMs)) {
      case Collector::Again::kNotPending: break;
      case Collector::Again::kDone: return false;
      case Collector::Again::kTimedOut: return true;  // freed once, later: never twice
    }
  }
  bool pooled;
  bool parked_before = false;
  {
    ScopedInsideLazypin inside;  // a signal handler's free meanwhile must not take the lock
    // The pool's lock busy: its holder may wait for the allocator's lock,
    // which this thread may hold (a signal handler's free that interrupted
    // malloc; the holder's btree frees a node). Then the collector takes the
    // block (it marks, unregisters and frees), and this thread waits for
    // nothing; without a free slot, it waits for the lock as before.
    if (!pool_->Leave(lo, lo + bytes, /*wait=*/false, &pooled)) {
      if (HandToCollector(block, bytes, /*may_wait=*/false)) return true;
      pool_->Leave(lo, lo + bytes, /*wait=*/true, &pooled);
    }
    // Kept: the block stays the allocator's (allocated) and registered, so
    // its pages stay the same until an allocation takes it back or the pool
    // releases it (unregister, then the real free). Only a block an
    // allocation could be given as a fresh one (Parkable): another would stay
    // parked while later allocations of its kind land elsewhere.
    if (pooled && reuse_) {
      // An mmapped chunk is served zeroed (a fresh one is new pages): the
      // collector, woken for it, zeroes it while it is parked
      // (Pool::ZeroParkedStep).
      const bool zero_ahead = zero_ahead_ && GlibcChunkOf(block, PageSize()).mmapped;
      if (Parkable(block) && pool_->Park(lo, bytes, zero_ahead)) {
        if (zero_ahead && collector_ != nullptr) collector_->Nudge();
        return true;
      }
      parked_before = pool_->HoldsParked(lo);
    }
  }
  if (!pooled) return false;
  if (parked_before) {
    // Its first free was parked: glibc has not seen it. Released here (the
    // unregister, then glibc's free of it, on this thread), then this one
    // goes to glibc.
    Leaving(lo, lo + bytes, EvictReason::kDoubleFree);
    return false;
  }
  // The collector unregisters, then frees it, so this thread never calls the
  // driver here (it may be a signal handler that interrupted the driver) nor
  // waits for an unregister stalled by a busy GPU.
  if (HandToCollector(block, bytes, /*may_wait=*/true)) return true;
  Leaving(lo, lo + bytes, EvictReason::kFree);  // no collector (exit) or all its slots taken: here
  return false;
}

bool MemoryGuard::HandToCollector(void* block, size_t bytes, bool may_wait) const {
  if (collector_ == nullptr) return false;
  // An mmapped chunk's free may move glibc's threshold: glibc sees it now (a
  // stand-in), so that the program's next allocations land where they would
  // without lazypin, however long the unregister takes.
  void* stand_in = glibc_ ? GlibcStandInFor(block) : nullptr;
  if (!collector_->TakeFree(block, bytes, may_wait, /*glibc_freed=*/stand_in != nullptr)) {
    if (stand_in != nullptr) GlibcUnmapChunk(stand_in);
    return false;
  }
  if (stand_in != nullptr) GlibcFreeStandIn(stand_in);
  return true;
}

bool MemoryGuard::ReleaseParked() const {
  if (!reuse_ || collector_ == nullptr || t_state.inside > 0 || t_own_thread || LeftProcess()) return false;
  constexpr int64_t kWaitMs = 2000;
  if (collector_->PendingBytes() != 0) collector_->WaitHandedFrees(kWaitMs);
  return collector_->ReleaseParked(kWaitMs);
}

void MemoryGuard::MakeRoomFor(size_t bytes) const {
  if (budget_ == nullptr || collector_ == nullptr || t_state.inside > 0 || t_own_thread || LeftProcess()) return;
  if (bytes >= (~size_t{0} >> 2)) return;  // no release makes that fit
  if (const uint64_t headroom = budget_->Announce(bytes); headroom != 0) {
    collector_->MakeRoom(headroom, kMakeRoomWaitMs);
  }
}

void MemoryGuard::HideParked(size_t* in_use, size_t* free_bytes, size_t* mmapped_count,
                             size_t* mmapped_bytes) const {
  if (!reuse_ || t_state.inside > 0 || LeftProcess()) return;
  ScopedInsideLazypin inside;
  pool_->ForEachParked([&](uintptr_t base, size_t) {
    const GlibcChunk chunk = GlibcChunkOf(reinterpret_cast<const void*>(base), PageSize());
    const auto less = [](size_t* v, size_t n) { *v = *v > n ? *v - n : 0; };
    if (chunk.mmapped) {
      less(mmapped_count, 1);
      less(mmapped_bytes, chunk.usable + 16);
    } else {
      less(in_use, chunk.usable + 8);
      *free_bytes += chunk.usable + 8;
    }
  });
}

bool MemoryGuard::ReleaseKept() const {
  if (collector_ == nullptr || t_state.inside > 0 || t_own_thread || LeftProcess()) return false;
  return collector_->MakeRoom(~uint64_t{0} >> 2, kMakeRoomWaitMs);  // more than can be had: all
}

void* MemoryGuard::Serve(size_t bytes, size_t align, bool* zeroed) const {
  if (!reuse_ || t_state.inside > 0) return nullptr;
  const FreshSizes sizes = GlibcFreshUsable(bytes, align, PageSize(), GlibcMmapFloorNow());
  if (!pool_->MaybeParked(sizes) || LeftProcess()) return nullptr;
  ScopedInsideLazypin inside;
  return reinterpret_cast<void*>(pool_->Unpark(sizes, align, zeroed));
}

}  // namespace lazypin
