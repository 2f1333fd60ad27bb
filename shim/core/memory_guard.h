// memory_guard: what happens when memory may leave the process while the
// pool holds registrations (every way it can leave). The memory hooks
// (hooks_memory.cc) are each a fast path and one call here; the shim
// publishes the guard only in defer mode.
//
// Contract: every entry point may run in any thread, inside allocators and
// signal handlers. On a thread that is inside lazypin's own code (which may
// hold the pool's lock), nothing here takes a lock: frees are queued on the
// thread or handed to the collector, ranges are left alone. In a copy of
// the process that fork's handlers missed, nothing here takes a lock either:
// the check comes first (see ProcessCheck), and everything passes through.
#pragma once

#include <cstddef>
#include <cstdint>

#include "glibc_blocks.h"
#include "host_alloc_cache.h"
#include "pool.h"
#include "types.h"

namespace lazypin {

class Collector;
class MemoryBudget;

class MemoryGuard {
 public:
  // True, once it switched lazypin to pass-through, in a copy of the process
  // (a raw clone's child), where the pool's lock may be held by a thread that
  // does not exist and the collector does not run. Async-signal-safe.
  using ProcessCheck = bool (*)();
  // `collector` may be null (then pooled blocks are invalidated on the
  // freeing thread); `left_process` may be null (never a copy).
  // `host_cache` (may be null): pinned host blocks the program freed and
  // lazypin keeps; memory leaving over one frees it first (Leaving).
  // `reuse`: freed malloc'd blocks come back (Pool::Park, Serve); the pool
  // must have EnableReuse'd.
  // `glibc`: the process's malloc family is glibc's (AllocatorReuseCheck), so
  // a freed block's header is read as glibc's free reads it (GlibcChunkOf).
  // `budget` (may be null): kept memory yields to allocations (MakeRoomFor).
  // `zero_ahead`: a parked mmapped chunk is zeroed by the collector before an
  // allocation takes it (Pool::ZeroParkedStep); only where a deferred
  // unregister waited for the work in flight (LAZYPIN_UNREGISTER_WAIT=1), so
  // that no copy the program left running reads the zeros.
  MemoryGuard(Pool* pool, Collector* collector, ProcessCheck left_process = nullptr,
              HostAllocCache* host_cache = nullptr, bool reuse = false, bool glibc = false,
              MemoryBudget* budget = nullptr, bool zero_ahead = false)
      : pool_(pool), collector_(collector), left_process_(left_process), host_cache_(host_cache),
        reuse_(reuse), glibc_(glibc || reuse), zero_ahead_(zero_ahead), budget_(budget) {}

  // Cheap and lock-free: false means the pool holds no entry (in use or
  // deferred) and the host-allocation cache keeps no block, and every call
  // below would do nothing.
  bool Holding() const { return pool_->Tracking() || HostHolding(); }

  // [lo, hi) leaves the process now (munmap, mremap, madvise, ...): pooled
  // registrations overlapping it are really unregistered before this returns,
  // and registrations the program still holds there are marked (Pool::MarkLeft)
  // so that its later unregister goes to the driver.
  void Leaving(uintptr_t lo, uintptr_t hi, EvictReason reason) const;

  // mprotect/pkey_mprotect(lo, hi - lo, prot) is about to run: if `prot`
  // takes read or write access away, the driver would refuse a registration
  // there, so [lo, hi) is treated as leaving (EvictReason::kMprotect); any
  // other protection only Touching.
  void Protecting(uintptr_t lo, uintptr_t hi, int prot) const;
  // A memory call acts on [lo, hi) (mprotect, mlock, mincore, msync, ...):
  // blocks the program gave back with cudaFreeHost and the host-allocation
  // cache keeps there are freed first, so that the call meets what it meets
  // without lazypin (unmapped memory). Registrations are not touched.
  void Touching(uintptr_t lo, uintptr_t hi, EvictReason reason) const;
  // mmap(MAP_FIXED_NOREPLACE) over [lo, hi): Touching, and blocks the
  // program freed that are parked there (LAZYPIN_REUSE_FREED) are released,
  // so that the mapping fails or succeeds as it does without lazypin.
  void Reclaiming(uintptr_t lo, uintptr_t hi) const;
  // The program registers [lo, hi) with a userfaultfd of its own
  // (UFFDIO_REGISTER): lazypin's kernel watch lets go of it first
  // (Pool::YieldWatch), so the kernel accepts the program's.
  void YieldingWatch(uintptr_t lo, uintptr_t hi) const;

  // free(block): true if the guard took the block over (it overlaps pooled
  // memory; it is freed once that is unregistered, by the collector or when
  // this thread leaves lazypin's code); false: the caller frees it now.
  // Async-signal-safe.
  // With reuse, a block whose one deferred registration is based at it is
  // parked (kept allocated and registered) instead.
  bool TakeFree(void* block) const;

  // An allocation of `bytes` aligned to `align` (0: malloc's): a parked block
  // its own fresh glibc block could have been (GlibcFreshUsable), or null
  // (then the caller allocates; glibc's mmap threshold: GlibcMmapFloorNow). Null on a thread inside lazypin's code and
  // in a copy of the process. Not async-signal-safe (nor is malloc).
  // `*zeroed` (may be null): the block reads as zeros to its usable end (an
  // mmapped chunk the collector zeroed while it was parked).
  void* Serve(size_t bytes, size_t align, bool* zeroed = nullptr) const;
  // glibc's state is to be as the program's frees left it (mallopt of the
  // mmap threshold, malloc_stats, malloc_info): waits for the frees handed
  // to the collector, then has it release every parked block (unregister,
  // then free), at most 2 s each. True if they were released. Never on a
  // thread inside lazypin's code; never calls the driver on the caller's
  // thread (it may be inside the driver).
  bool ReleaseParked() const;
  // The program is about to allocate `bytes` (and touch them) while lazypin
  // keeps memory it gave back: when the headroom does not cover them and the
  // margin (MemoryBudget::Announce), has the collector release kept memory
  // first and waits for that (at most kMakeRoomWaitMs). Never on a thread
  // inside lazypin's code, never calls the driver on the caller's thread.
  void MakeRoomFor(size_t bytes) const;
  static constexpr int64_t kMakeRoomWaitMs = 1000;
  // An allocation of the program's failed (malloc & co., mmap), or the
  // program lowers RLIMIT_AS or RLIMIT_DATA, while anything is kept: has the
  // collector release everything kept (parked blocks, kept host blocks) and
  // waits for that, at most kMakeRoomWaitMs. True if it did (try the
  // allocation once more). The same rules as MakeRoomFor.
  bool ReleaseKept() const;
  // mallinfo2's figures as glibc would give them had the parked blocks been
  // freed: out of use (a heap chunk into the free bytes, an mmapped chunk
  // unmapped).
  void HideParked(size_t* in_use, size_t* free_bytes, size_t* mmapped_count,
                  size_t* mmapped_bytes) const;
  // What a block handed to free or realloc spans (0: glibc would reject it,
  // and the call is left to glibc to reject; see GlibcChunkOf).
  size_t BlockBytes(const void* block) const;

 private:
  // The collector takes the free of `block` (false: the caller frees it).
  bool HandToCollector(void* block, size_t bytes, bool may_wait) const;
  // A block an allocation could be given as it is, with glibc's state after
  // its free as without lazypin (GlibcChunkOf; an mmapped chunk only of a
  // size glibc would mmap again, GlibcMmapFloorNow, and whose free would not
  // move glibc's mmap threshold, GlibcFreeMovesThreshold).
  static bool Parkable(const void* block);
  bool LeftProcess() const { return left_process_ != nullptr && left_process_(); }
  bool HostHolding() const { return host_cache_ != nullptr && host_cache_->MaybeHolds(); }

  Pool* const pool_;
  Collector* const collector_;
  const ProcessCheck left_process_;
  HostAllocCache* const host_cache_;
  const bool reuse_;
  const bool glibc_;
  const bool zero_ahead_;
  MemoryBudget* const budget_;
};

}  // namespace lazypin
