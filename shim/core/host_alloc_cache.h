// host_alloc_cache: pinned host blocks the program freed (cudaFreeHost,
// cuMemFreeHost), kept allocated and handed back to a later allocation that
// asks for exactly the same thing (cudaHostAlloc, cudaMallocHost,
// cuMemHostAlloc, cuMemAllocHost). Policy only: the driver is reached through
// HostAllocDriver (lazypin's own frees) and the program's `forward` callables,
// so tests drive it with a fake and no CUDA (tests/unit/core/host_alloc_cache_test.cc).
//
// Invariants (docs/design.md, "The host-allocation cache"):
//  - The driver's host allocations are the program's live blocks plus the
//    cached ones (and those being released); the cache knows every block it
//    tracks by base.
//  - A block is served only for the same requested byte count, the same flags
//    and the same context it was allocated with: its flags, device pointer
//    and the sizes the driver reports for it are then those of a fresh one.
//    A served block is zeroed first (a fresh one reads as zeros).
//  - Any other call that touches a cached block (a pointer query, a second
//    free, a register, memory leaving) really frees it first (Invalidate),
//    waiting for a release in progress, so the driver answers as for freed
//    memory.
//  - The driver is never called with the lock held.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/functional/function_ref.h"
#include "memory_budget.h"
#include "pool.h"
#include "types.h"

namespace lazypin {

// The cache's only route to the driver, for its own frees.
class HostAllocDriver {
 public:
  virtual ~HostAllocDriver() = default;
  // Really frees the block at `ptr` (cuMemFreeHost), allocated in `ctx`, after
  // waiting for the GPU's work in flight there without stalling other threads
  // (as PoolDriver::Unregister); fills `wait` in.
  virtual int Free(uintptr_t ptr, Context ctx, ReleaseWait* wait) = 0;
  // The flags the driver reports for the block at `ptr` (cuMemHostGetFlags);
  // false when it does not say.
  virtual bool Flags(uintptr_t ptr, unsigned* flags) = 0;
  virtual int64_t NowNs() = 0;
  // The pages [ptr, ptr + bytes) made inaccessible (a kept block: the
  // program's access after its free faults, as the driver's unmapping makes
  // it fault bare) or accessible again (served, or about to be freed).
  virtual void Protect(uintptr_t ptr, size_t bytes, bool accessible) {}
};

// Told of the cache's own frees, for the log.
class HostAllocObserver {
 public:
  virtual ~HostAllocObserver() = default;
  virtual void OnHostRelease(uintptr_t ptr, size_t bytes, EvictReason reason, int result,
                             int64_t latency_ns, const ReleaseWait& wait) = 0;
};

// No defaults of its own for the bounds: HostAllocLimitsFrom (option_limits.h).
struct HostAllocLimits {
  uint64_t max_bytes = 0;    // LAZYPIN_HOST_ALLOC_CACHE; 0: keep nothing
  uint64_t max_entries = 0;  // LAZYPIN_POOL_ENTRIES (blocks, counted apart from the pool's)
  bool zero = true;                        // zero a served block (a fresh one reads as zeros)
  // Kept blocks yield to the program's demand (may be null): a free is kept
  // only if it says so, and kept blocks count in its gauge.
  MemoryBudget* budget = nullptr;
};

struct HostAllocRequest {
  // The driver's flags (low 24 bits), with the program's API that asked
  // above them (Flags): a block is served only to the same pair.
  static constexpr int kApiShift = 24;
  static unsigned Flags(unsigned driver_flags, unsigned api) { return driver_flags | api << kApiShift; }
  unsigned driver_flags() const { return flags & ((1u << kApiShift) - 1); }

  size_t bytes = 0;
  unsigned flags = 0;
  Context ctx = nullptr;
  int device = -1;
};

struct HostAllocCounters {
  uint64_t hits = 0, misses = 0;  // allocations served from the cache / by the driver
  uint64_t kept = 0;              // frees kept in the cache
  uint64_t forwarded_frees = 0;   // frees passed to the driver
  uint64_t releases[static_cast<int>(EvictReason::kCount)] = {};  // lazypin's own frees
  uint64_t forgotten = 0;         // cached blocks a context teardown freed
  uint64_t cached_bytes = 0, cached_entries = 0;
  uint64_t peak_bytes = 0, peak_entries = 0;
  uint64_t zeroed_bytes = 0;
  int64_t zero_ns = 0;            // time spent zeroing served blocks
  uint64_t forced_releases = 0;
};

class HostAllocCache {
 public:
  // The bytes of memory a block of `bytes` occupies (the driver maps whole pages).
  static size_t Span(size_t bytes) { return (bytes + 4095) & ~size_t{4095}; }
  // A block the driver gave pages of its own: page-aligned and at least
  // kOwnPagesMin (smaller ones may share a page with another block). Only
  // such a block is zeroed to its last page's end and made inaccessible while kept.
  static constexpr size_t kOwnPagesMin = size_t{64} << 10;
  static bool OwnsItsPages(uintptr_t base, size_t bytes);
  void Protect(uintptr_t base, size_t bytes, bool accessible);

  HostAllocCache(HostAllocDriver* driver, HostAllocObserver* observer, HostAllocLimits limits);
  HostAllocCache(const HostAllocCache&) = delete;
  HostAllocCache& operator=(const HostAllocCache&) = delete;

  // A program's allocation: a cached block matching `request` (action kHit,
  // `*out` set, zeroed), or `forward` (the program's own call, which fills
  // `*out`), whose block is then tracked (kMiss). A forward that fails for
  // lack of memory releases the cache and is retried once.
  Outcome Alloc(const HostAllocRequest& request, void** out, absl::FunctionRef<int()> forward);
  // A program's free of `ptr`. A live block is kept (kDeferred) if it fits
  // the bounds and `may_keep()` says so (called without the lock: the
  // implicit wait for the device goes there); else forwarded (kForward). A
  // cached block (a second free) is really freed, then the program's free is
  // forwarded, so the program gets the driver's answer for freed memory.
  Outcome Free(uintptr_t ptr, absl::FunctionRef<int()> forward, absl::FunctionRef<bool()> may_keep);

  // Cheap and lock-free: false means Invalidate would do nothing.
  bool MaybeHolds() const { return holding_.load(std::memory_order_relaxed) != 0; }
  // Really frees the cached blocks overlapping [lo, hi) (their whole pages),
  // after any release in progress there. Returns how many it freed.
  int Invalidate(uintptr_t lo, uintptr_t hi, EvictReason reason);

  // A context or a device's primary context is torn down: the driver frees
  // its blocks, live and cached; the cache forgets them (no driver call).
  // Returns how many blocks it forgot.
  int ForgetContext(Context ctx);
  int ForgetDevice(int device);
  // The collector: really frees the blocks cached for longer than `idle_ns`.
  int CollectIdle(int64_t idle_ns);
  int ReleaseAll(EvictReason reason);
  // Really frees the block kept longest; false if none is kept.
  bool ReleaseOldest(EvictReason reason);
  // In a fork's child: never use or free a block again (no lock, no driver).
  void AbandonAfterFork() { abandoned_.store(true, std::memory_order_relaxed); }
  bool Abandoned() const { return abandoned_.load(std::memory_order_relaxed); }

  HostAllocCounters Counters() const;

 private:
  enum class State { kLive, kCached, kReleasing };
  struct Block {
    size_t bytes;
    unsigned flags;
    Context ctx;
    int device;
    State state;
    uint64_t lru_key;     // valid while kCached
    int64_t freed_at;     // ns, valid while kCached
  };
  struct Key {
    size_t bytes;
    unsigned flags;
    uintptr_t ctx;
    bool operator<(const Key& o) const {
      if (bytes != o.bytes) return bytes < o.bytes;
      if (flags != o.flags) return flags < o.flags;
      return ctx < o.ctx;
    }
  };
  struct Victim {
    uintptr_t base;
    size_t bytes;
    Context ctx;
    EvictReason reason;
  };
  using Map = absl::btree_map<uintptr_t, Block>;

  static Key KeyOf(const Block& b) { return Key{b.bytes, b.flags, reinterpret_cast<uintptr_t>(b.ctx)}; }
  void Uncache(uintptr_t base, Block& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The driver packs small pinned blocks into larger allocations, and a block
  // reports its allocation's flags: a cudaHostAlloc(portable|mapped) made
  // while a kept cudaMallocHost block of the same context lived read flags 2
  // on the H200 (bare: 3). After a miss in a context where blocks are kept
  // under other flags, Repack asks the driver what the new block reports;
  // when that is not what a block of its own allocation reports (the flags
  // asked for, with DEVICEMAP: all host memory is mapped), it frees the new
  // block, releases those kept blocks (as the program's frees would have) and
  // allocates again, setting `*result`. Returns the blocks released.
  bool KeepsOtherFlags(const HostAllocRequest& request) ABSL_LOCKS_EXCLUDED(mu_);
  int Repack(const HostAllocRequest& request, void** out, absl::FunctionRef<int()> forward,
             int* result) ABSL_LOCKS_EXCLUDED(mu_);
  Victim TakeVictim(uintptr_t base, Block& b, EvictReason reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until no block overlapping [lo, hi) is being released.
  void AwaitQuiet(std::unique_lock<std::mutex>& lock, uintptr_t lo, uintptr_t hi);
  bool RangeQuiet(uintptr_t lo, uintptr_t hi) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // holding_, mirrored in the budget's gauge.
  void AddHolding(int64_t n) {
    holding_.fetch_add(n, std::memory_order_relaxed);
    if (limits_.budget != nullptr) {
      limits_.budget->gauge()->fetch_add(n * MemoryBudget::kKeptUnit, std::memory_order_relaxed);
    }
  }
  // Frees the victims through the driver without the lock, then forgets them.
  int Release(const Victim* victims, size_t count) ABSL_LOCKS_EXCLUDED(mu_);
  int Release(const std::vector<Victim>& victims) { return Release(victims.data(), victims.size()); }
  int ForgetWhere(absl::FunctionRef<bool(const Block&)> matches) ABSL_LOCKS_EXCLUDED(mu_);
  int ReleaseWhere(absl::FunctionRef<bool(const Block&)> matches, EvictReason reason)
      ABSL_LOCKS_EXCLUDED(mu_);

  HostAllocDriver* const driver_;
  HostAllocObserver* const observer_;
  const HostAllocLimits limits_;

  mutable std::mutex mu_;
  std::condition_variable released_;  // a release finished: AwaitQuiet looks again
  Map blocks_ ABSL_GUARDED_BY(mu_);   // every block tracked, by base
  absl::btree_multimap<Key, uintptr_t> index_ ABSL_GUARDED_BY(mu_);  // cached blocks by key
  // How many blocks are cached for each (context, flags): what KeepsOtherFlags reads.
  absl::btree_map<std::pair<uintptr_t, unsigned>, size_t> cached_kinds_ ABSL_GUARDED_BY(mu_);
  absl::btree_map<uint64_t, uintptr_t> lru_ ABSL_GUARDED_BY(mu_);    // cached blocks, oldest first
  uint64_t next_lru_key_ ABSL_GUARDED_BY(mu_) = 1;
  int releasing_ ABSL_GUARDED_BY(mu_) = 0;
  HostAllocCounters counters_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> holding_{0};  // cached + releasing blocks
  std::atomic<bool> abandoned_{false};
};

}  // namespace lazypin
