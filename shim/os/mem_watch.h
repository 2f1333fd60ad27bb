// mem_watch: the kernel's word on registered memory. A userfaultfd, asked
// only for events (UNMAP, REMOVE, REMAP), reports every unmap, madvise removal
// and mremap of a watched range, from any caller: raw system calls, glibc's
// and the loader's internal ones, other libraries. The hooks see only the
// calls that go through the PLT; this is their backstop (docs/design.md, "The
// kernel watch").
//
// Contracts:
//  - Ranges are registered in write-protect mode and no page is ever
//    write-protected: no fault of the program ever waits on lazypin, and a
//    read(2) into a watched buffer works as without the watch. Missing mode is
//    never used (faults on absent pages would block, or fail with EFAULT from
//    the kernel under UFFD_USER_MODE_ONLY).
//  - An unmapping thread waits in the kernel until its event is read. The
//    reader thread (all signals blocked) reads events and pushes them into a
//    fixed ring without taking any lock, and without allocating; a full ring
//    sets "everything is dirty".
//  - Drain() applies every event whose system call has returned and every
//    event the kernel has queued so far (see Drain).
//  - A fork child does not inherit the registrations (EVENT_FORK is not
//    asked); it calls AbandonAfterFork().
//  - The descriptor is used only while it is lazypin's (HeldFd). A program
//    that dup2()s onto its number ends the watch (the kernel drops every
//    registration with the file): the first drain after that applies
//    "everything is dirty", and no range is watched again (kLost).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "descriptors.h"
#include "lazypin_thread.h"
#include "thread_state.h"

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/functional/function_ref.h"

namespace lazypin {

// Why Watch() refused a range. The caller does not defer such a range.
enum class WatchRefusal {
  kNone,
  kOwnedByProgram,  // EBUSY: the program has its own userfaultfd on it: lazypin steps aside
  kUnwatchable,     // EINVAL: a mapping userfaultfd cannot watch (a regular file, SysV shm)
  kTooMany,         // past the bound on watched ranges (vm.max_map_count headroom)
  kLost,            // the program took the watch's descriptor number over (dup2)
};
const char* WatchRefusalName(WatchRefusal refusal);

struct MemWatchOptions {
  // At most this many disjoint watched runs (0: vm.max_map_count / 8). Each
  // isolated run splits its VMA in up to 3, so the default adds at most a
  // quarter of the process's mapping limit.
  size_t max_ranges = 0;
  // Events the ring holds before "everything is dirty".
  size_t ring_capacity = 4096;
  // Calls userfaultfd even where a seccomp filter may be in force (which may
  // kill the process for it); else Open says no there (seccomp.h).
  bool under_seccomp = false;
};

struct MemWatchCounters {
  uint64_t events = 0;      // unmap/remove/remap events read
  uint64_t overflows = 0;   // times the ring was full (then everything was dirty)
  uint64_t unexpected = 0;  // messages other than the three events (never expected)
  uint64_t watched_runs = 0;
};

class MemWatch {
 public:
  // Opens the userfaultfd and starts the reader thread. Null when the kernel,
  // a sysctl or a seccomp profile refuses it; then *why is one line saying
  // which and what to change.
  static std::unique_ptr<MemWatch> Open(std::string* why, MemWatchOptions options = {});
  // Unregisters everything, stops the reader and closes the descriptor.
  ~MemWatch();
  MemWatch(const MemWatch&) = delete;
  MemWatch& operator=(const MemWatch&) = delete;

  // Watches the pages of [lo, hi). Pages shared with other watched ranges are
  // counted, so each Watch needs one Unwatch. False (and *refusal) when the
  // range cannot be watched; then nothing changed.
  bool Watch(uintptr_t lo, uintptr_t hi, WatchRefusal* refusal = nullptr);
  // Ends one Watch of [lo, hi) (the registration really ended): pages no other
  // watched range holds are unregistered from the kernel. The kernel's
  // unregister of a write-protect range visits every page (0.16 s per
  // populated GiB on the development VM) under the process's mmap lock, which
  // fork needs too: while held (HoldUnwatches, fork's prepare handler), an
  // Unwatch of kUnwatchLaterFrom bytes or more is queued and made by
  // lazypin's unwatch thread once let go (the parent's handler), so the fork
  // does not wait for it. A Watch of pages it is unregistering waits for it.
  // Events for pages still watched meanwhile find nothing pooled (at worst a
  // new registration there is not deferred). Otherwise it is made here: the
  // memory usually leaves right after (free, munmap), and its event must not
  // outlive the registration.
  void Unwatch(uintptr_t lo, uintptr_t hi);
  static constexpr uintptr_t kUnwatchLaterFrom = uintptr_t{1} << 20;
  void HoldUnwatches(bool hold);

  // Calls apply(lo, hi) for every range the kernel reported since the last
  // Drain (apply(0, UINTPTR_MAX) after an overflow). It sees every event
  // whose system call has returned, and every event the kernel has queued
  // but nobody has read yet. When nothing is watched and every event read is
  // applied (events of ranges unwatched since must not reach a later Watch
  // of the same addresses): a few loads.
  // Call it without holding any lock that `apply` takes; not from a signal
  // handler that may have interrupted Drain on the same thread.
  void Drain(absl::FunctionRef<void(uintptr_t lo, uintptr_t hi)> apply) {
    if (watched_runs_.load(std::memory_order_relaxed) == 0 && Settled()) return;
    DrainSlow(apply);
  }
  // Drain() of what has been read: every event whose system call has
  // returned (its thread waits in the kernel until the event is read), and
  // no read(2) of its own. Events the kernel has queued and nobody has read
  // yet (their system call still in progress) are the reader thread's: it
  // reads them within microseconds, and the next Drain or DrainReturned
  // applies them. When everything read is applied: four loads, no system
  // call, no lock. The deferral path's drain: a deferral hands nothing to the
  // program, and whatever uses the entry later drains the queue first.
  void DrainReturned(absl::FunctionRef<void(uintptr_t lo, uintptr_t hi)> apply) {
    if (Settled()) return;
    DrainSlow(apply);
  }

  // In a fork's child: forget everything; no thread, no ioctl, no lock.
  void AbandonAfterFork();

  MemWatchCounters Counters() const;
  // How many disjoint runs are watched now, and the bound.
  size_t WatchedRuns() const { return watched_runs_.load(std::memory_order_relaxed); }
  size_t MaxRuns() const { return max_runs_; }

 private:
  struct Event {
    uintptr_t lo, hi;        // the range whose pages left
    uintptr_t to_lo, to_hi;  // REMAP: where the VMA (and our registration) went; else 0
  };
  // Watched pages: disjoint runs [lo, end) -> how many Watch calls hold them.
  struct Run {
    uintptr_t end;
    uint32_t count;
  };

  struct Range {
    uintptr_t lo, hi;
  };

  MemWatch(int fd, MemWatchOptions options, size_t max_runs);
  void ReaderLoop();
  void UnwatcherLoop();
  // Queues [lo, hi) for the unwatch thread while held; false (nothing
  // queued) when not held, or the queue is full or busy (a signal handler on
  // a thread inside Later).
  bool Later(uintptr_t lo, uintptr_t hi);
  // Unwatch's bookkeeping; the pages to unregister go into `pieces` (up to
  // `max`; their count returned) or, with `pieces` null or full, are
  // unregistered here, with the lock held.
  size_t UnwatchLocked(uintptr_t lo, uintptr_t hi, Range* pieces, size_t max)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool UnregisteringLocked(uintptr_t lo, uintptr_t hi) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads every queued message without blocking; take(event) for each event.
  void ReadEvents(absl::FunctionRef<void(const Event&)> take);
  // One event's effect (apply, unless everything is dirty anyway).
  void Apply(const Event& e, bool all_dirty, absl::FunctionRef<void(uintptr_t, uintptr_t)> apply);
  bool Push(const Event& e);  // producer: the reader thread
  bool Pop(Event* e);         // consumer: holder of apply_mu_
  void DrainSlow(absl::FunctionRef<void(uintptr_t, uintptr_t)> apply);
  // True when every event read from the descriptor so far has been applied
  // by a Drain that returned (see the ordering in mem_watch.cc).
  bool Settled() const;
  // Splits the run containing `at` so that a run starts there.
  void SplitAt(uintptr_t at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unregisters the parts of [lo, hi) that no watched run holds.
  void UnregisterUncountedLocked(uintptr_t lo, uintptr_t hi) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unregister(uintptr_t lo, uintptr_t hi);
  void PublishRunsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The descriptor still ours, else lost_ set (and overflow_: everything is
  // dirty at the next drain). Any thread.
  bool FdOurs();

  HeldFd fd_;  // the one descriptor the watch holds
  std::atomic<bool> lost_{false};
  std::atomic<uintptr_t> stop_page_{0};  // the destructor's page: its unmap event sets stop_
  std::atomic<bool> stop_{false};          // the reader returns
  const size_t max_runs_;

  // Ring: single producer (the reader thread), single consumer (whoever
  // holds apply_mu_). Fixed at construction.
  std::unique_ptr<Event[]> ring_;
  const size_t ring_capacity_;
  std::atomic<uint64_t> ring_head_{0};  // next to pop
  std::atomic<uint64_t> ring_tail_{0};  // next to push
  std::atomic<bool> overflow_{false};

  // The reader's read passes: odd from before its read until after its push.
  std::atomic<uint32_t> reading_{0};
  // Drains in progress: nonzero from before a Drain's read until after its
  // last apply (Settled: an event it read may not be applied yet).
  std::atomic<uint32_t> draining_{0};
  std::mutex apply_mu_;  // Drain: across read, pop and apply (consumers serialized)
  std::mutex mu_;        // the runs
  absl::btree_map<uintptr_t, Run> runs_ ABSL_GUARDED_BY(mu_);
  // Pages the unwatch thread is unregistering without mu_ held (their runs
  // are gone already): a Watch overlapping them waits (unregistered_).
  static constexpr size_t kPieces = 16;
  Range unregistering_[kPieces] ABSL_GUARDED_BY(mu_) = {};
  size_t unregistering_count_ ABSL_GUARDED_BY(mu_) = 0;
  std::condition_variable unregistered_;
  // Unwatches handed to the unwatch thread (fixed: a release may run in a
  // memory hook, where nothing is allocated).
  static constexpr size_t kLaterSlots = 4096;
  std::mutex later_mu_;  // the queue only, never held across a system call
  std::atomic<uint32_t> later_seq_{0};  // futex: bumped after each change of the queue's state
  void NotifyLater();
  Range later_[kLaterSlots] ABSL_GUARDED_BY(later_mu_) = {};
  size_t later_head_ ABSL_GUARDED_BY(later_mu_) = 0;  // a ring: the oldest
  size_t later_count_ ABSL_GUARDED_BY(later_mu_) = 0;
  bool stop_later_ ABSL_GUARDED_BY(later_mu_) = false;
  bool hold_later_ ABSL_GUARDED_BY(later_mu_) = false;
  std::atomic<size_t> watched_runs_{0};

  std::atomic<uint64_t> events_{0}, overflows_{0}, unexpected_{0};
  std::atomic<bool> abandoned_{false};
  LazypinThread reader_;
  LazypinThread unwatcher_;
};

}  // namespace lazypin
