// pool: the policy of lazypin, and nothing else. It keeps two views of host
// registrations apart: the program's (what it registered and has not
// unregistered: state kInUse) and the driver's (kInUse plus what lazypin keeps
// alive after the program unregistered it: kDeferred). It decides hit, miss,
// defer and evict; it reaches the driver only through PoolDriver, so tests
// drive it with a fake and no CUDA at all.
//
// Invariants (see docs/design.md):
//  - The driver's registrations are exactly the entries of this map (in-use,
//    deferred, or evicting), so a program call that the pool forwards gets the
//    driver's own answer, error codes included.
//  - A hit needs an exact match (base, bytes, flags, context): whatever the
//    program then asks the driver about that memory is answered truthfully.
//  - Before memory touched by a deferred entry leaves the process, or is the
//    subject of any call other than an exact hit, that entry is really
//    unregistered (evicted) first. Callers wait for evictions in progress.
//  - The driver's calls that act (Register, Unregister, Admit, Release,
//    DrainChanges) are never made with the lock held; under it the pool only
//    reads the driver's clock (AgeClockNs) and the pages' frames (ReadFrames).
//  - An unregister is deferred only for memory that has stayed in the
//    process, with its protection, since it was registered: an in-use entry
//    whose memory left (MarkLeft) has its unregister forwarded, so the driver
//    answers as without lazypin.
#pragma once

#include <atomic>
#include <iterator>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/functional/function_ref.h"
#include "absl/base/thread_annotations.h"
#include "glibc_blocks.h"
#include "granule_filter.h"
#include "park_index.h"
#include "types.h"

namespace lazypin {

class MemoryBudget;
using Context = void*;  // a CUcontext, opaque to the pool

// How a release went before its unregister: the time spent waiting for the
// GPU's work in flight, and whether it was released without that wait
// finishing (a capture in progress, or the wait's bound passed).
// `after_wait` is the caller's: the release right before, in the same
// batch and context, waited already, so this one does not wait again (one
// wait per batch: a fork's release of the whole pool, an eviction's victims).
struct ReleaseWait {
  int64_t waited_ns = 0;
  bool forced = false;
  bool after_wait = false;
};

// How far a drain of the watch's page changes reaches (PoolDriver::DrainChanges).
enum class DrainScope { kQueued, kReturned };

// The pool's only route to the driver.
class PoolDriver {
 public:
  virtual ~PoolDriver() = default;
  // Really unregisters the registration based at `ptr`, made in `ctx`;
  // fills `wait` in (a driver that does not wait leaves it as it is).
  virtual int Unregister(uintptr_t ptr, Context ctx, ReleaseWait* wait) = 0;
  // The physical frames now behind [ptr, ptr+bytes), one per page; false if unknown.
  virtual bool ReadFrames(uintptr_t ptr, size_t bytes, std::vector<uint64_t>* frames) = 0;
  virtual int64_t NowNs() = 0;
  // The clock of deferred entries' ages (LAZYPIN_IDLE_MS): may be coarse
  // (milliseconds), as long as it is one clock.
  virtual int64_t AgeClockNs() { return NowNs(); }

  // The kernel watch and the page classes (mem_watch.h, page_class.h); a
  // driver without them defers everything and reports no changes.
  // Before the driver registers [lo, hi): kNone if lazypin may defer it (then
  // Release() follows when the registration ends), else why not.
  virtual PassReason Admit(uintptr_t lo, uintptr_t hi) { return PassReason::kNone; }
  virtual void Release(uintptr_t lo, uintptr_t hi) {}
  // After Admit, just before the driver registers [lo, hi) (a miss): may
  // fault its pages in first, contents unchanged (prefault.h).
  virtual void Prefault(uintptr_t lo, uintptr_t hi, unsigned flags) {}
  // Before a registration in `ctx` exists: makes what Unregister(…, ctx, …)
  // needs (so that a release allocates nothing and starts no thread).
  virtual void PrepareRelease(Context ctx) {}
  // On the thread that makes the pool's releases (the collector), before
  // its first: what the driver keeps per thread (libcuda's thread-local
  // blocks) is made now, while the program's limits still leave room for it.
  virtual void PrepareReleasingThread() {}
  // Calls changed(lo, hi) for every range whose pages changed since the last
  // call, as far as the watch knows: with kQueued, every change the kernel
  // has queued (MemWatch::Drain, one system call at least); with kReturned,
  // every change whose system call has returned (MemWatch::DrainReturned: no
  // system call when all are applied).
  virtual void DrainChanges(DrainScope scope,
                            absl::FunctionRef<void(uintptr_t lo, uintptr_t hi)> changed) {}
};

// Freed blocks that come back (LAZYPIN_REUSE_FREED): a block the program
// frees while a deferred entry based at it holds it stays allocated and
// registered ("parked") until an allocation it fits takes it (then the
// program's next register of it is a hit) or the entry is released (then,
// after the unregister, `free_block` really frees it). `gauge` (may be
// null) follows the number of parked blocks with relaxed stores, for the
// allocation hooks' fast path; a released block counts until its
// `free_block` returned (an allocation that fails meanwhile retries).
struct ReuseHooks {
  void (*free_block)(void* block) = nullptr;
  std::atomic<int64_t>* gauge = nullptr;
  // At most this many bytes (usable sizes) parked at once: memory the program
  // believes freed (LAZYPIN_REUSE_FREED). A free past it is handled as before.
  uint64_t max_bytes = ~uint64_t{0};
  // Parked blocks yield to the program's demand (may be null): a block is
  // parked only if it says so (MemoryBudget::MayKeep).
  MemoryBudget* budget = nullptr;
};

// Told of what the pool does outside the program's own calls (for the log).
class PoolObserver {
 public:
  virtual ~PoolObserver() = default;
  virtual void OnEvict(uintptr_t ptr, size_t bytes, EvictReason reason, int result,
                       int64_t latency_ns, const ReleaseWait& wait) = 0;
  virtual void OnWarning(const std::string& message) = 0;
};

// No defaults of its own: PoolLimitsFrom (option_limits.h) fills it from Config.
struct PoolLimits {
  uint64_t max_bytes = 0;     // LAZYPIN_POOL_BYTES
  uint64_t max_entries = 0;   // LAZYPIN_POOL_ENTRIES
  bool check_frames = false;  // LAZYPIN_CHECK_PFN
};

struct RegisterRequest {
  uintptr_t ptr = 0;
  size_t bytes = 0;
  unsigned flags = 0;
  Context ctx = nullptr;
  int device = 0;
};

// What happened to one program call.
struct Outcome {
  int result = kCudaSuccess;
  Action action = Action::kForward;
  int evicted = 0;  // pooled registrations really unregistered on its behalf
  PassReason reason = PassReason::kNone;  // with kPassthrough: why
};

struct PoolCounters {
  uint64_t hits = 0, misses = 0, deferred = 0, passed = 0;
  uint64_t evictions[static_cast<int>(EvictReason::kCount)] = {};
  uint64_t pooled_bytes = 0, pooled_entries = 0;
  uint64_t peak_bytes = 0, peak_entries = 0;
  uint64_t forced_releases = 0;  // evictions whose wait for the GPU did not finish
  uint64_t parked = 0, served = 0;  // frees kept (parked) and handed back to an allocation
  uint64_t served_zeroed = 0;       // of those served, the ones zeroed ahead (ZeroParkedStep)
  uint64_t parked_now = 0;          // blocks parked at this moment
  uint64_t parked_bytes = 0;        // their usable bytes
  // Auto-pins (LAZYPIN_AUTOPIN, auto_pin.h): registrations lazypin made for
  // a copy's pageable host memory; the copies that found theirs in place;
  // the program's registers they served (exact hits); attempts refused for
  // the bounds; bytes held auto-pinned now (part of pooled_bytes).
  uint64_t autopins = 0, autopin_bytes = 0, autopin_copies = 0, autopin_copy_bytes = 0;
  uint64_t autopin_hits = 0, autopin_full = 0, autopinned_bytes = 0;
  uint64_t autopin_queried = 0;  // attempts declined: queries or overlapping copies keep releasing that range
  int64_t autopin_register_ns = 0;
};

// What Pool::AutoPin did for one copy's host range.
enum class AutoPinResult {
  kPinned,   // registered now, held as a deferred (lazypin-owned) entry
  kCovered,  // a deferred entry of the same context already holds the whole range
  kSkipped,  // left alone: the program's (or partly pooled), not eligible, over the bounds,
             // or the driver refused (`driver_result`)
};
struct AutoPinOutcome {
  AutoPinResult result = AutoPinResult::kSkipped;
  int driver_result = kCudaSuccess;  // the register's answer, when one was made
  int64_t register_ns = 0;           // its cost
  bool attempted = false;            // a register was made
};

class Pool {
 public:
  Pool(PoolDriver* driver, PoolObserver* observer, PoolLimits limits);
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  // A program's register. `forward` makes the program's own call to the driver.
  Outcome Register(const RegisterRequest& request, absl::FunctionRef<int()> forward);
  // A program's unregister of `ptr`; with `may_defer` false (no current
  // context, the implicit wait failed) it is forwarded, never deferred.
  Outcome Unregister(uintptr_t ptr, absl::FunctionRef<int()> forward, bool may_defer = true);

  // The two outcomes that need no driver call, for a caller (the runtime
  // hook) that must not forward through its own path: an exact hit, or a
  // deferral. Empty when the call needs the driver (then use the above).
  std::optional<Outcome> TryHit(const RegisterRequest& request);
  std::optional<Outcome> TryDefer(uintptr_t ptr);

  // Auto-pin (LAZYPIN_AUTOPIN): a host-device copy is about to use the
  // pageable host range [req.ptr, req.ptr + req.bytes) in req.ctx. First the
  // deferred entries it covers in part are released, as BeforeCopy does
  // (another thread may have pinned one since). If a
  // deferred entry of that context holds the whole range, it is touched
  // (most recently used, not idle) and kCovered returned. If any entry shares
  // a page with it (the program's registration, or a deferred one of another
  // context holding it), nothing is done. Otherwise, if it fits the bounds without evicting anything
  // (pool bytes and entries, and `max_auto_bytes` for auto-pinned bytes),
  // `eligible()` agrees (its pages are private anonymous and the driver knows
  // nothing of them), and the driver's watch admits it, `register_fn()`
  // registers it (flags 0) and it enters the pool as a deferred entry: to the
  // program it is still pageable. A range whose auto-pin was released
  // kAutoPinQueryLimit times (by an Invalidate for a query, or by copies
  // that overlap it without lying inside it: BeforeCopy), or whose register
  // the driver refused, is not auto-pinned again (a program that copies two
  // overlapping ranges in turn would pay a register and an unregister per
  // copy; a refused one a failed register), until 16 other such ranges have
  // been seen. To the
  // program it is still pageable, and it is invalidated, evicted, hit and
  // released exactly like memory the program unregistered. Neither callback
  // is called with the lock held.
  AutoPinOutcome AutoPin(const RegisterRequest& req, uint64_t max_auto_bytes,
                         absl::FunctionRef<bool()> eligible, absl::FunctionRef<int()> register_fn);

  // Applies the page changes the driver's watch reports (DrainChanges):
  // deferred entries they touch are really unregistered, in-use ones will
  // not be deferred. Every program entry point above starts with it:
  // deferrals (TryDefer) with kReturned, the others kQueued.
  void ApplyPageChanges(DrainScope scope = DrainScope::kQueued) ABSL_LOCKS_EXCLUDED(mu_);

  // A copy is about to move host memory [lo, hi) through the driver, which
  // copies through any registration it holds there: applies the page changes
  // (as ApplyPageChanges), then waits for the evictions in progress on
  // [lo, hi) (another thread's apply may have taken such an entry, and the
  // driver holds it until its unregister returns). Then, unless [lo, hi)
  // lies inside one entry (deferred or in use), the deferred entries sharing
  // a page with it are really unregistered (EvictReason::kOverlap): the
  // driver refuses a copy that starts inside a registration and runs past
  // it, where bare that memory is pageable and the copy succeeds; in-use
  // entries are the program's, and the driver answers as bare. Afterwards no
  // registration the pool deferred there has pages that changed before the
  // call, and none covers part of [lo, hi) only.
  void BeforeCopy(uintptr_t lo, uintptr_t hi);

  // Memory [lo, hi) leaves the process, or a pointer query touches it: really
  // unregister the deferred entries overlapping it. Returns how many.
  int Invalidate(uintptr_t lo, uintptr_t hi, EvictReason reason);
  // Cheap and lock-free: false means Invalidate(lo, hi) would do nothing.
  bool MaybeHolds(uintptr_t lo, uintptr_t hi) const {
    return holding_.load(std::memory_order_relaxed) != 0 && filter_.MaybeOverlaps(lo, hi);
  }
  bool Empty() const { return holding_.load(std::memory_order_relaxed) == 0; }
  // Cheap and lock-free, for the memory hooks: false means no entry at all
  // (in use or deferred) can overlap [lo, hi), so MarkLeft and Invalidate
  // would do nothing. Tracking(): false means that for every range.
  bool Tracking() const {
    return !Empty() || in_use_.load(std::memory_order_relaxed) != 0;
  }
  bool MaybeTracks(uintptr_t lo, uintptr_t hi) const {
    return MaybeHolds(lo, hi) ||
           (in_use_.load(std::memory_order_relaxed) != 0 && in_use_filter_.MaybeOverlaps(lo, hi));
  }
  // Memory [lo, hi) leaves the process (or loses its protection) while the
  // program may hold registrations in it: the in-use entries overlapping it
  // are marked so that they never become deferred; the program's unregister
  // of one is forwarded. Returns how many were marked.
  int MarkLeft(uintptr_t lo, uintptr_t hi);
  // Exact (takes the lock): a deferred or evicting entry overlaps [lo, hi).
  bool HoldsDeferred(uintptr_t lo, uintptr_t hi) const;
  // MarkLeft, then HoldsDeferred into `pooled`, under one lock. `wait`
  // false: only if the lock is free now; false (nothing done) when another
  // thread holds it.
  bool Leave(uintptr_t lo, uintptr_t hi, bool wait, bool* pooled);

  // A context is destroyed (or a primary context reset or released): release
  // its deferred entries; forget its in-use ones too when `forget_in_use`.
  int DropContext(Context ctx, bool forget_in_use = true);
  // A device's primary context is reset or released: release its deferred
  // entries; forget its in-use ones too when `forget_in_use` (reset).
  int DropDevice(int device, bool forget_in_use);
  // The collector: release deferred entries unused for `idle_ns`.
  int CollectIdle(int64_t idle_ns, EvictReason reason = EvictReason::kIdle);
  // Release every deferred entry (LAZYPIN_RELEASE_AT_EXIT).
  int ReleaseAll(EvictReason reason);
  // In a fork's child: forget everything without touching the driver or the
  // lock (another thread may have held it at fork time); pass everything
  // through. In a copy made without fork()'s handlers (a raw fork or clone),
  // `unregister_deferred`: the copy of the driver's state still holds the
  // registrations the program gave up, which a fork() child finds released
  // (the prepare handler's ReleaseAll); they are unregistered here, without a
  // wait (the child's own work is all there is) and only if the lock is free.
  void AbandonAfterFork(bool unregister_deferred = false);
  bool Abandoned() const { return abandoned_.load(std::memory_order_relaxed); }

  PoolCounters Counters() const;
  // Faults the lock-free filters' tables in, so that the first deferrals
  // take no page fault there. For a thread of lazypin's (the collector).
  void Prefault() {
    filter_.Prefault();
    in_use_filter_.Prefault();
  }
  // On the thread that will make the releases, before the first (PoolDriver).
  void PrepareReleasingThread() { driver_->PrepareReleasingThread(); }

  // Freed blocks that come back (see ReuseHooks). Call before the pool is shared.
  void EnableReuse(ReuseHooks hooks);
  bool ReuseEnabled() const { return reuse_.free_block != nullptr; }
  // free(block) of `usable` bytes (malloc_usable_size): parks it if reuse is
  // on and one deferred entry, based at `block` and no longer than `usable`,
  // is all the pool holds there (nothing in flight or evicting on it), within
  // ReuseHooks::max_bytes. True:
  // the caller must not free it. Never waits for an eviction. `zero_ahead`:
  // a block its allocation is served zeroed (ZeroParkedStep zeroes it first).
  bool Park(uintptr_t block, size_t usable, bool zero_ahead = false);
  // An allocation whose fresh block could have any of `sizes`' usable sizes
  // and needs `align`: a parked block that fits, taken out of the park (its
  // entry stays deferred until the program registers it: a hit); 0 if none,
  // and 0 when the lock stays busy over a few yields (it never blocks).
  // `*zeroed` (may be null): the block reads as zeros to its usable end.
  uintptr_t Unpark(const FreshSizes& sizes, size_t align, bool* zeroed = nullptr);
  // One step of zeroing parked blocks ahead of their reuse, for one thread
  // only (the collector): writes zeros into at most `max_bytes` of a block
  // parked with `zero_ahead`, with non-temporal stores and without the lock.
  // A block that leaves the park meanwhile (served or released) stops it
  // before the next write; its Unpark or real free waits for a write in
  // progress (at most one step's). Returns the bytes written (0: nothing to
  // zero, or the block left the park).
  size_t ZeroParkedStep(size_t max_bytes);
  // Releases every parked block overlapping [lo, hi) (unregister, then the
  // real free): an allocation failed while they held memory, or the program
  // maps over memory it freed. Returns how many.
  int ReleaseParked(EvictReason reason, uintptr_t lo = 0, uintptr_t hi = ~uintptr_t{0});
  // A parked block is based at `block` (a free of it is the program's second).
  bool HoldsParked(uintptr_t block) const;
  // Calls each(base, usable) for every parked block, with the lock held
  // (`each` must not call into the pool).
  void ForEachParked(absl::FunctionRef<void(uintptr_t base, size_t usable)> each) const;
  // Another userfaultfd is to register [lo, hi) (the program's own): the
  // kernel allows one per range, so lazypin lets go of it. Deferred entries
  // there are released (`reason`); in-use ones are unwatched and never
  // deferred (their unregister is the driver's). Returns how many were touched.
  int YieldWatch(uintptr_t lo, uintptr_t hi, EvictReason reason);
  // Releases the block parked longest (unregister, then the real free):
  // false if none is parked.
  bool ReleaseOldestParked(EvictReason reason);
  // Cheap and lock-free: false means Unpark(sizes, ...) would find nothing.
  bool MaybeParked(const FreshSizes& sizes) const {
    for (int i = 0; i < sizes.count; ++i) {
      if (park_filter_[ParkSlot(sizes.usable[i])].load(std::memory_order_relaxed) != 0) return true;
    }
    return false;
  }

 private:
  // kEvicting: lazypin's unregister on its way to the driver. Calls on an
  // overlapping range wait for it, and for the program's calls in flight.
  enum class State { kInUse, kDeferred, kEvicting };
  struct Range {
    uintptr_t lo, hi;
  };
  struct Entry {
    uintptr_t base;
    size_t bytes;
    unsigned flags;
    Context ctx;
    int device;
    State state;
    PassReason pass;     // kNone: deferrable
    bool watched;        // Admit() said kNone: Release() when it ends
    uint64_t lru_key;    // valid while kDeferred
    int64_t deferred_at;  // AgeClockNs(), valid while kDeferred
    std::vector<uint64_t> frames;  // with check_frames: the pages registered
    bool left = false;  // kInUse only: the memory left the process or changed (MarkLeft, the watch)
    size_t parked = 0;  // kDeferred only: parked, with this malloc_usable_size (0: not)
    bool auto_pinned = false;  // kDeferred only: lazypin registered it (AutoPin), not the program
  };
  struct Victim {
    uintptr_t base;
    size_t bytes;
    Context ctx;
    EvictReason reason;
    bool watched;
    bool parked;  // the block is lazypin's: really freed after the unregister
  };
  using Map = absl::btree_map<uintptr_t, Entry>;

  // First entry whose byte range may overlap [lo, hi) (entries are disjoint,
  // so their ends are sorted like their bases).
  Map::iterator FirstOverlap(uintptr_t lo) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int MarkLeftLocked(uintptr_t lo, uintptr_t hi) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HoldsDeferredLocked(uintptr_t lo, uintptr_t hi) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool RangeQuiet(uintptr_t lo, uintptr_t hi) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AwaitQuiet(std::unique_lock<std::mutex>& lock, uintptr_t lo, uintptr_t hi);
  void MarkDeferred(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnmarkDeferred(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An in-use entry not marked left is in in_use_filter_ and in_use_ while it
  // is in that state: Watch when it enters it, Unwatch when it leaves it. So
  // is a call in flight (BeginInflight, EndInflight).
  void TrackInUse(const Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UntrackInUse(const Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the entry at `it` (any state), keeping the lock-free views.
  Map::iterator Erase(Map::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TakeVictim(Entry& e, EvictReason reason, std::vector<Victim>* victims)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Victim TakeVictim(Entry& e, EvictReason reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TakeOverBounds(std::vector<Victim>* victims) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unregisters the victims without the lock, then removes them. Returns the count.
  int Evict(std::vector<Victim>& victims) ABSL_LOCKS_EXCLUDED(mu_);
  int Evict(const Victim* victims, size_t count) ABSL_LOCKS_EXCLUDED(mu_);
  bool FramesUnchanged(const Entry& e);
  // BeforeCopy's release: the deferred entries sharing a page with [lo, hi),
  // unless one entry holds all of it.
  void TakePartlyCopied(uintptr_t lo, uintptr_t hi, std::vector<Victim>* victims)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases the deferred entries `matches` picks; forgets its in-use ones too
  // when `forget_in_use`. The pool's answer to context teardown.
  int DropWhere(absl::FunctionRef<bool(const Entry&)> matches, bool forget_in_use)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A program call on its way to the driver, over `bytes` (after AwaitQuiet:
  // no other call in flight has the same bytes), until EndInflight(bytes).
  // Calls over the same pages wait for it (RangeQuiet). It counts in the
  // lock-free in-use view, so that the memory hooks report changes of its
  // bytes (MarkLeft) as the watch does (ApplyPageChanges).
  void BeginInflight(Range bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndInflight(Range bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // Notes a change of [lo, hi) on the calls in flight over those bytes.
  void MarkInflightLeftLocked(uintptr_t lo, uintptr_t hi) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a change was noted on the call in flight over `bytes`.
  bool InflightLeftLocked(Range bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The exact-hit check and its effect; null if no hit.
  const Entry* HitLocked(const RegisterRequest& req) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Defers the in-use entry based at `ptr` if it is poolable; false otherwise.
  bool DeferLocked(uintptr_t ptr, std::vector<Victim>* victims) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseWatched(const std::vector<Range>& ranges);
  // Takes a parked entry's block out of the park; true if it was parked.
  bool UnparkLocked(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The bookkeeping of a block that left the index (counters, filter). The
  // gauge still counts it: until it is served (Unpark) or really freed
  // (FreeParked), its memory is lazypin's to give back.
  void ForgetParked(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeParked(uintptr_t block);
  // Until no zeroing step writes into `block` (after it left the park).
  void AwaitZeroWrite(uintptr_t block) const;
  // One step of ZeroParkedStep; `*cancelled`: its block had left the park.
  size_t ZeroParkedStepOnce(size_t max_bytes, bool* cancelled);
  void FreeBlocks(const std::vector<uintptr_t>& blocks);
  static size_t ParkSlot(size_t usable) { return (usable >> 4) % kParkSlots; }
  // Auto-pinned ranges that queries or overlapping copies released, most recent first (see AutoPin).
  static constexpr int kAutoPinQueryLimit = 2;
  struct Queried {
    uintptr_t base = 0;
    size_t bytes = 0;
    int count = 0;
  };
  Queried* FindQueried(uintptr_t base, size_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts `count` more releases (or a refusal: kAutoPinQueryLimit) of the range.
  void NoteQueried(uintptr_t base, size_t bytes, int count) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  PoolDriver* const driver_;
  PoolObserver* const observer_;
  const PoolLimits limits_;

  mutable std::mutex mu_;
  std::condition_variable evicted_;  // an eviction or a register finished: AwaitQuiet looks again
  Map entries_ ABSL_GUARDED_BY(mu_);
  // Deferred entries in deferral order: lru_key -> base. A sentinel past
  // every real key stays in the btree, so that it never frees its root when
  // the last deferred entry leaves (a hit) and allocates one when the next
  // comes (a deferral): a loop of one buffer would allocate per call.
  class LruIndex {
   public:
    using iterator = absl::btree_map<uint64_t, uintptr_t>::iterator;
    LruIndex() { map_.emplace(kSentinel, 0); }
    bool empty() const { return map_.size() == 1; }
    iterator begin() { return map_.begin(); }
    iterator end() { return std::prev(map_.end()); }  // the sentinel
    void emplace(uint64_t key, uintptr_t base) { map_.emplace(key, base); }
    void erase(uint64_t key) { map_.erase(key); }

   private:
    static constexpr uint64_t kSentinel = ~uint64_t{0};
    absl::btree_map<uint64_t, uintptr_t> map_;
  };
  LruIndex lru_ ABSL_GUARDED_BY(mu_);
  uint64_t next_lru_key_ ABSL_GUARDED_BY(mu_) = 1;
  // Program calls on their way to the driver (their bytes): a call on an
  // overlapping page range waits, as the driver orders them, so that none
  // acts on a state the driver no longer has. A handful at a time.
  // `left`: a change of these pages was noted meanwhile (by the watch or a
  // memory hook): the entry the call makes or puts back has left (Register
  // and a failed Unregister mark it so; AutoPin releases its registration).
  struct Inflight {
    Range bytes;
    bool left;
  };
  std::vector<Inflight> inflight_ ABSL_GUARDED_BY(mu_);
  size_t evicting_ ABSL_GUARDED_BY(mu_) = 0;  // entries in kEvicting: with inflight_ empty, all is quiet
  PoolCounters counters_ ABSL_GUARDED_BY(mu_);
  Queried queried_[16] ABSL_GUARDED_BY(mu_);
  int queried_next_ ABSL_GUARDED_BY(mu_) = 0;

  std::atomic<int64_t> holding_{0};  // deferred + evicting entries
  std::atomic<int64_t> in_use_{0};  // in-use entries not marked left, and calls in flight
  std::atomic<bool> abandoned_{false};
  GranuleFilter filter_;         // deferred + evicting entries
  GranuleFilter in_use_filter_;  // in-use entries not marked left, and calls in flight

  ReuseHooks reuse_;
  ParkIndex park_ ABSL_GUARDED_BY(mu_);
  // A counting filter over parked usable sizes (writers hold the lock).
  static constexpr size_t kParkSlots = 64;
  static constexpr int kUnparkTries = 64;  // Unpark: tries of a busy lock before it gives up
  std::atomic<uint32_t> park_filter_[kParkSlots] = {};
  // ZeroParkedStep's block (0: none) and how far it got. zero_block_ changes
  // under the lock (the stepping thread's alone); the others are that
  // thread's. zero_cancel_: the block left the park (set under the lock).
  // zero_writing_: the block while zeros are being written into it, checked
  // against zero_cancel_ the other way round (both seq_cst): a release that
  // set the cancel and then finds no write in progress may free the block.
  uintptr_t zero_block_ ABSL_GUARDED_BY(mu_) = 0;
  size_t zero_usable_ = 0;
  size_t zero_done_ = 0;
  std::atomic<bool> zero_cancel_{false};
  std::atomic<uintptr_t> zero_writing_{0};
};

}  // namespace lazypin
