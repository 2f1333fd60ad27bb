// mem_watch: the userfaultfd event watch (see mem_watch.h).
//
// Ordering (why a hit served after Drain() never uses pages the kernel has
// already taken away):
//  1. An unmapping thread A waits in the kernel until its event E is read from
//     the descriptor (by the reader or by a Drain).
//  2. The reader thread reads and pushes inside a pass: `reading_` is odd
//     from before its read until after its push. A Drain applies what its own
//     read returns itself, and holds apply_mu_ from before its read until
//     after its last apply.
//  3. A Drain by thread B reads first (non-blocking), then waits until the
//     reader is in no pass that began before, then pops the ring: every
//     event read before B's read ended is seen, by the reader (its pass
//     began before B's read returned EAGAIN, so it is pushed when B pops) or
//     by B itself; and so is every event the kernel had queued when B's read
//     began, even while A still waits (another thread may have mapped and
//     registered the freed address meanwhile).
//  4. A full ring sets `overflow_` inside a pass, so B sees it and applies
//     everything.
//  5. DrainReturned (deferrals) makes no read: Settled() says whether
//     every event read so far is applied. An event E whose system call has
//     returned was read inside a reader pass (pushed before `reading_` turns
//     even) or by a Drain (`draining_` nonzero from before its read until
//     after its applies). Settled loads, in this order: `reading_` (odd: a
//     pass is open), `overflow_`, the ring's tail then head (an event pushed
//     and not popped), `draining_` last (a Drain that popped or read E and
//     has not finished applying it: a pop precedes the load of head, the
//     Drain's increment precedes its pop, so `draining_` is still nonzero
//     unless the Drain finished). All four as before: every read event is
//     applied. Events queued and unread are the reader's; their system call
//     has not returned, so no program order puts them before the hit.
// The reader never takes apply_mu_ or any lock of the pool's, and a Drain
// holds nothing the reader needs: a signal handler that unmaps on a thread
// inside Drain waits only for the reader, which never waits on anyone. So a
// Drain needs no signal mask change: one read(2) when nothing is pending.
#include "lazypin_thread.h"
#include "mem_watch.h"

#include <pthread.h>
#include <signal.h>

#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sched.h>
#include <pthread.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "descriptors.h"
#include "pages.h"
#include "seccomp.h"
#include "sys.h"
#include "thread_state.h"

#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif
#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC_NEW _IO(0xAA, 0x00)
#endif

namespace lazypin {
namespace {

constexpr uint64_t kFeatures =
    UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_REMAP;

long SysctlValue(const char* path, long fallback) {
  char buf[64];
  if (!ReadSmallFile(path, buf, sizeof buf)) return fallback;
  return strtol(buf, nullptr, 10);
}

// A userfaultfd, or -1 with *why. Tries the user-mode-only system call (open
// to any user since 5.11), the plain one (older kernels, or root with
// vm.unprivileged_userfaultfd=0), then /dev/userfaultfd (5.17+, by file mode).
int OpenUserfaultfd(std::string* why) {
  const int flags = O_CLOEXEC | O_NONBLOCK;
  int fd = static_cast<int>(syscall(SYS_userfaultfd, flags | UFFD_USER_MODE_ONLY));
  const int err_user = fd < 0 ? errno : 0;
  if (fd < 0) fd = static_cast<int>(syscall(SYS_userfaultfd, flags));
  const int err_plain = fd < 0 ? errno : 0;
  int err_dev = 0;
  if (fd < 0) {
    const int dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
    if (dev < 0) {
      err_dev = errno;
    } else {
      fd = ioctl(dev, USERFAULTFD_IOC_NEW, flags | UFFD_USER_MODE_ONLY);
      if (fd < 0) fd = ioctl(dev, USERFAULTFD_IOC_NEW, flags);
      if (fd < 0) err_dev = errno;
      close(dev);
    }
  }
  if (fd >= 0) return fd;
  char line[512];
  snprintf(line, sizeof line,
           "userfaultfd refused: syscall(user-mode-only): %s, syscall: %s, /dev/userfaultfd: %s "
           "(vm.unprivileged_userfaultfd=%ld; %s%s)",
           strerrorname_np(err_user) ? strerrorname_np(err_user) : "?",
           strerrorname_np(err_plain) ? strerrorname_np(err_plain) : "?",
           strerrorname_np(err_dev) ? strerrorname_np(err_dev) : "?",
           SysctlValue("/proc/sys/vm/unprivileged_userfaultfd", -1), SeccompStatusText().c_str(),
           err_user == ENOSYS ? "; ENOSYS: no userfaultfd in this kernel, or a seccomp profile "
                                "answers ENOSYS"
                              : "");
  *why = line;
  return -1;
}

bool RegisterWp(int fd, uintptr_t lo, uintptr_t hi) {
  struct uffdio_register reg = {};
  reg.range.start = lo;
  reg.range.len = hi - lo;
  reg.mode = UFFDIO_REGISTER_MODE_WP;  // events only: no page is ever write-protected
  return ioctl(fd, UFFDIO_REGISTER, &reg) == 0;
}

}  // namespace

const char* WatchRefusalName(WatchRefusal refusal) {
  switch (refusal) {
    case WatchRefusal::kNone: return "none";
    case WatchRefusal::kOwnedByProgram: return "owned_by_program";
    case WatchRefusal::kUnwatchable: return "unwatchable";
    case WatchRefusal::kTooMany: return "too_many";
    case WatchRefusal::kLost: return "descriptor_lost";
  }
  return "?";
}

std::unique_ptr<MemWatch> MemWatch::Open(std::string* why, MemWatchOptions options) {
  if (!options.under_seccomp && SeccompFiltered()) {
    *why = "a seccomp filter is in force (" + SeccompStatusText() +
           "): lazypin calls neither userfaultfd nor its other optional system calls (the "
           "prefault threads'), which it may forbid; LAZYPIN_WATCH=kernel tries userfaultfd";
    return nullptr;
  }
  const int fd = OpenUserfaultfd(why);
  if (fd < 0) return nullptr;
  struct uffdio_api api = {};
  api.api = UFFD_API;
  api.features = kFeatures;
  if (ioctl(fd, UFFDIO_API, &api) != 0 || (api.features & kFeatures) != kFeatures) {
    *why = std::string("userfaultfd: UFFDIO_API refused the unmap/remove/remap events: ") +
           strerror(errno);
    close(fd);
    return nullptr;
  }
  // Probe: write-protect-mode registration of anonymous memory (absent
  // where the architecture or kernel lacks uffd-wp).
  void* page = mmap(nullptr, PageSize(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) {
    *why = "userfaultfd: probe mmap failed";
    close(fd);
    return nullptr;
  }
  const uintptr_t p = reinterpret_cast<uintptr_t>(page);
  if (!RegisterWp(fd, p, p + PageSize())) {
    *why = std::string("userfaultfd: write-protect registration of anonymous memory refused: ") +
           strerror(errno);
    munmap(page, PageSize());
    close(fd);
    return nullptr;
  }
  struct uffdio_range range = {p, PageSize()};
  ioctl(fd, UFFDIO_UNREGISTER, &range);
  munmap(page, PageSize());

  size_t max_runs = options.max_ranges;
  if (max_runs == 0) {
    max_runs = static_cast<size_t>(SysctlValue("/proc/sys/vm/max_map_count", 65530)) / 8;
  }
  if (max_runs < 4) max_runs = 4;
  if (options.ring_capacity < 16) options.ring_capacity = 16;
  return std::unique_ptr<MemWatch>(new MemWatch(fd, options, max_runs));
}

MemWatch::MemWatch(int fd, MemWatchOptions options, size_t max_runs)
    : max_runs_(max_runs),
      ring_(new Event[options.ring_capacity]),
      ring_capacity_(options.ring_capacity) {
  fd_.Hold(fd);  // out of the program's way (descriptors.h)
  reader_ = StartThreadWithSignalsBlocked([this] {
    pthread_setname_np(pthread_self(), "lazypin-watch");
    ReaderLoop();
  });
  try {
    unwatcher_ = StartThreadWithSignalsBlocked([this] {
      pthread_setname_np(pthread_self(), "lazypin-unwatch");
      UnwatcherLoop();
    });
  } catch (...) {
    // No thread: every Unwatch is made on its caller's thread.
    std::lock_guard<std::mutex> lock(later_mu_);
    stop_later_ = true;
  }
}

MemWatch::~MemWatch() {
  if (abandoned_.load(std::memory_order_relaxed)) {
    // A fork's child: the parent's threads do not exist here.
    if (reader_.joinable()) reader_.detach();
    if (unwatcher_.joinable()) unwatcher_.detach();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(later_mu_);
    stop_later_ = true;  // what is queued is unregistered below with the rest
  }
  NotifyLater();
  if (unwatcher_.joinable()) unwatcher_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [lo, run] : runs_) Unregister(lo, run.end);
    runs_.clear();
    PublishRunsLocked();
  }
  // The reader is told to stop by an event on its own descriptor (no other
  // descriptor is held for that): a page watched and unmapped here, whose
  // event whoever reads it turns into stop_ (munmap returns once it is read,
  // so the reader is still there to read it). If the page cannot be had,
  // stop_ is set directly and the reader's poll times out within 10 s.
  bool told = false;
  void* page = mmap(nullptr, PageSize(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (page != MAP_FAILED) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(page);
    bool registered = false;
    if (FdOurs() && fd_.Use([&](int fd) { registered = RegisterWp(fd, p, p + PageSize()); }) &&
        registered) {
      stop_page_.store(p, std::memory_order_release);
      told = true;
    }
    munmap(page, PageSize());
  }
  if (!told) stop_.store(true, std::memory_order_release);
  if (reader_.joinable()) reader_.join();
  fd_.Close();  // releases any thread still waiting on an unread event
}

void MemWatch::AbandonAfterFork() {
  abandoned_.store(true, std::memory_order_relaxed);
  watched_runs_.store(0, std::memory_order_relaxed);
  // Closing drops only this process's reference to the parent's descriptor,
  // so that it never keeps the parent's registrations alive (no ioctl).
  fd_.Close();
}

void MemWatch::ReaderLoop() {
  ScopedInsideLazypin inside;  // nothing it calls is lazypin's to intercept
  struct pollfd fds[1] = {{-1, POLLIN, 0}};
  for (;;) {
    fds[0].fd = fd_.get();  // the hooks may have moved it (descriptors.h)
    // The timeout matters only to a destructor that could not map its page
    // (see ~MemWatch); otherwise an idle reader wakes every 10 s for nothing.
    const struct timespec timeout = {10, 0};
    // Every signal stays blocked here, unlike lazypin's other idle threads:
    // a program's handler run on this thread that unmaps or drops watched
    // pages would wait for this very thread to read the event.
    const int r = ppoll(fds, 1, &timeout, nullptr);
    if (stop_.load(std::memory_order_acquire)) return;
    // The number is the program's now: never read it (its poll above held
    // the old file; returning lets the kernel release it, and with it any
    // unmapping thread still waiting on an event).
    if (!FdOurs()) return;
    if (r < 0) continue;  // EINTR (signals are blocked here) or ENOMEM: poll again
    if (fds[0].revents & POLLIN) {
      reading_.fetch_add(1, std::memory_order_seq_cst);  // odd: in a pass
      ReadEvents([this](const Event& e) {
        if (!Push(e)) {
          overflow_.store(true, std::memory_order_release);
          overflows_.fetch_add(1, std::memory_order_relaxed);
        }
      });
      reading_.fetch_add(1, std::memory_order_seq_cst);
      if (stop_.load(std::memory_order_acquire)) return;
    } else if (fds[0].revents != 0) {
      usleep(1000);  // POLLERR/POLLHUP never expected on an initialized descriptor: do not spin
    }
  }
}

bool MemWatch::FdOurs() {
  if (fd_.Ours()) return true;
  if (!lost_.exchange(true, std::memory_order_acq_rel)) {
    overflow_.store(true, std::memory_order_release);
    overflows_.fetch_add(1, std::memory_order_relaxed);
  }
  return false;
}

void MemWatch::ReadEvents(absl::FunctionRef<void(const Event&)> take) {
  struct uffd_msg msgs[16];
  for (;;) {
    ssize_t n = -1;
    int err = 0;
    if (!FdOurs() || !fd_.Use([&](int fd) {
          n = read(fd, msgs, sizeof msgs);
          err = errno;
        })) {
      return;
    }
    if (n < 0 && err == EINTR) continue;
    if (n <= 0) return;  // EAGAIN: nothing queued
    const size_t count = static_cast<size_t>(n) / sizeof msgs[0];
    for (size_t i = 0; i < count; ++i) {
      const uffd_msg& m = msgs[i];
      Event e = {};
      switch (m.event) {
        case UFFD_EVENT_UNMAP:
          e.lo = m.arg.remove.start;
          e.hi = m.arg.remove.end;
          if (e.lo != 0 && e.lo == stop_page_.load(std::memory_order_acquire)) {
            stop_.store(true, std::memory_order_release);  // the destructor's word
          }
          break;
        case UFFD_EVENT_REMOVE:
          e.lo = m.arg.remove.start;
          e.hi = m.arg.remove.end;
          break;
        case UFFD_EVENT_REMAP:
          e.lo = m.arg.remap.from;
          e.hi = m.arg.remap.from + m.arg.remap.len;
          e.to_lo = m.arg.remap.to;
          e.to_hi = m.arg.remap.to + m.arg.remap.len;
          break;
        default:
          unexpected_.fetch_add(1, std::memory_order_relaxed);
          continue;
      }
      events_.fetch_add(1, std::memory_order_relaxed);
      take(e);
    }
    if (static_cast<size_t>(n) < sizeof msgs) return;
  }
}

bool MemWatch::Push(const Event& e) {
  const uint64_t tail = ring_tail_.load(std::memory_order_relaxed);
  const uint64_t head = ring_head_.load(std::memory_order_acquire);
  if (tail - head >= ring_capacity_) return false;
  ring_[tail % ring_capacity_] = e;
  ring_tail_.store(tail + 1, std::memory_order_release);
  return true;
}

bool MemWatch::Pop(Event* e) {
  const uint64_t head = ring_head_.load(std::memory_order_relaxed);
  const uint64_t tail = ring_tail_.load(std::memory_order_acquire);
  if (head == tail) return false;
  *e = ring_[head % ring_capacity_];
  ring_head_.store(head + 1, std::memory_order_release);
  return true;
}

void MemWatch::Apply(const Event& e, bool all_dirty,
                     absl::FunctionRef<void(uintptr_t, uintptr_t)> apply) {
  if (!all_dirty) apply(e.lo, e.hi);
  if (e.to_hi != 0) {
    // mremap carried our registration to the new address: drop it there
    // unless a Watch holds those pages (the program may want them for a
    // userfaultfd of its own).
    std::lock_guard<std::mutex> lock(mu_);
    UnregisterUncountedLocked(e.to_lo, e.to_hi);
  }
}

bool MemWatch::Settled() const {
  if (reading_.load(std::memory_order_seq_cst) % 2 != 0) return false;
  if (overflow_.load(std::memory_order_seq_cst)) return false;
  const uint64_t tail = ring_tail_.load(std::memory_order_seq_cst);
  if (ring_head_.load(std::memory_order_seq_cst) != tail) return false;
  return draining_.load(std::memory_order_seq_cst) == 0;
}

void MemWatch::DrainSlow(absl::FunctionRef<void(uintptr_t, uintptr_t)> apply) {
  if (abandoned_.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> applying(apply_mu_);
  draining_.fetch_add(1, std::memory_order_seq_cst);
  struct Done {
    std::atomic<uint32_t>* draining;
    ~Done() { draining->fetch_sub(1, std::memory_order_seq_cst); }
  } done{&draining_};
  ReadEvents([&](const Event& e) { Apply(e, false, apply); });
  // The reader's pass in progress, if any, may hold events queued before
  // the read above returned: let it push them.
  const uint32_t seen = reading_.load(std::memory_order_seq_cst);
  if (seen % 2 != 0) {
    while (reading_.load(std::memory_order_acquire) == seen) sched_yield();
  }
  // Exchanged before the pops below: whatever a full ring dropped until now
  // is covered by apply(0, UINTPTR_MAX).
  const bool overflow = overflow_.load(std::memory_order_acquire) &&
                        overflow_.exchange(false, std::memory_order_acq_rel);
  Event e;
  while (Pop(&e)) Apply(e, overflow, apply);
  if (overflow) apply(0, UINTPTR_MAX);
}

void MemWatch::SplitAt(uintptr_t at) {
  auto it = runs_.upper_bound(at);
  if (it == runs_.begin()) return;
  --it;
  if (it->first < at && at < it->second.end) {
    const Run tail = {it->second.end, it->second.count};
    it->second.end = at;
    runs_.emplace(at, tail);
  }
}

void MemWatch::Unregister(uintptr_t lo, uintptr_t hi) {
  // Errors are expected and harmless: the pages may be unmapped, or belong
  // now to a mapping the kernel never registered with us.
  struct uffdio_range range = {lo, hi - lo};
  fd_.Use([&](int fd) { ioctl(fd, UFFDIO_UNREGISTER, &range); });
}

void MemWatch::UnregisterUncountedLocked(uintptr_t lo, uintptr_t hi) {
  lo = PageFloor(lo);
  hi = PageCeil(hi);
  uintptr_t cursor = lo;
  auto it = runs_.upper_bound(lo);
  if (it != runs_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.end > lo) it = prev;
  }
  for (; cursor < hi; ++it) {
    const uintptr_t next = (it != runs_.end() && it->first < hi) ? it->first : hi;
    if (next > cursor) Unregister(cursor, next);
    if (it == runs_.end() || it->first >= hi) break;
    cursor = it->second.end;
  }
}

void MemWatch::PublishRunsLocked() {
  watched_runs_.store(runs_.size(), std::memory_order_relaxed);
}

bool MemWatch::Watch(uintptr_t lo, uintptr_t hi, WatchRefusal* refusal) {
  WatchRefusal ignored;
  if (refusal == nullptr) refusal = &ignored;
  *refusal = WatchRefusal::kNone;
  lo = PageFloor(lo);
  hi = PageCeil(hi);
  if (lo >= hi || abandoned_.load(std::memory_order_relaxed)) {
    *refusal = WatchRefusal::kUnwatchable;
    return false;
  }
  std::unique_lock<std::mutex> lock(mu_);
  // Not while the unwatch thread unregisters any of these pages: the
  // kernel would end the registration made here.
  unregistered_.wait(lock, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !UnregisteringLocked(lo, hi); });
  // A Watch adds at most 2 split runs and the gaps between existing ones.
  size_t gaps = 1;
  for (auto it = runs_.lower_bound(lo); it != runs_.end() && it->first < hi; ++it) ++gaps;
  if (runs_.size() + gaps + 2 > max_runs_) {
    *refusal = WatchRefusal::kTooMany;
    return false;
  }
  // The whole range, every time: registering pages already registered with
  // this descriptor is allowed, and it re-arms pages whose VMA the kernel
  // replaced since (a munmap and a new mapping at the same address).
  if (!FdOurs()) {
    *refusal = WatchRefusal::kLost;
    return false;
  }
  bool registered = false;
  int err = EBADF;
  fd_.Use([&](int fd) {
    registered = RegisterWp(fd, lo, hi);
    err = errno;
  });
  if (!registered) {
    if (err == EBUSY) {
      *refusal = WatchRefusal::kOwnedByProgram;  // refused before any change
    } else {
      *refusal = err == ENOMEM ? WatchRefusal::kTooMany : WatchRefusal::kUnwatchable;
      if (err != EINVAL) UnregisterUncountedLocked(lo, hi);  // a split may have half-applied it
    }
    return false;
  }
  SplitAt(lo);
  SplitAt(hi);
  uintptr_t cursor = lo;
  auto it = runs_.lower_bound(lo);
  while (cursor < hi) {
    if (it != runs_.end() && it->first == cursor) {
      ++it->second.count;
      cursor = it->second.end;
      ++it;
    } else {
      const uintptr_t next = (it != runs_.end() && it->first < hi) ? it->first : hi;
      it = runs_.emplace_hint(it, cursor, Run{next, 1});
      ++it;
      cursor = next;
    }
  }
  PublishRunsLocked();
  return true;
}

void MemWatch::Unwatch(uintptr_t lo, uintptr_t hi) {
  lo = PageFloor(lo);
  hi = PageCeil(hi);
  if (lo >= hi || abandoned_.load(std::memory_order_relaxed)) return;
  if (hi - lo >= kUnwatchLaterFrom && Later(lo, hi)) return;
  std::lock_guard<std::mutex> lock(mu_);
  UnwatchLocked(lo, hi, nullptr, 0);
}

size_t MemWatch::UnwatchLocked(uintptr_t lo, uintptr_t hi, Range* pieces, size_t max) {
  SplitAt(lo);
  SplitAt(hi);
  size_t count = 0;
  const auto unregister = [&](uintptr_t from, uintptr_t to) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (pieces != nullptr && count < max) {
      pieces[count++] = Range{from, to};
    } else {
      Unregister(from, to);
    }
  };
  uintptr_t free_lo = 0, free_hi = 0;  // contiguous pages left to unregister
  for (auto it = runs_.lower_bound(lo); it != runs_.end() && it->first < hi;) {
    if (--it->second.count != 0) {
      ++it;
      continue;
    }
    if (free_hi != it->first) {
      if (free_hi > free_lo) unregister(free_lo, free_hi);
      free_lo = it->first;
    }
    free_hi = it->second.end;
    it = runs_.erase(it);
  }
  if (free_hi > free_lo) unregister(free_lo, free_hi);
  PublishRunsLocked();
  return count;
}

bool MemWatch::Later(uintptr_t lo, uintptr_t hi) {
  std::unique_lock<std::mutex> queue(later_mu_, std::try_to_lock);
  if (!queue.owns_lock() || !hold_later_ || stop_later_ || later_count_ == kLaterSlots) return false;
  later_[(later_head_ + later_count_++) % kLaterSlots] = Range{lo, hi};
  queue.unlock();
  NotifyLater();
  return true;
}

void MemWatch::HoldUnwatches(bool hold) {
  {
    std::lock_guard<std::mutex> queue(later_mu_);
    hold_later_ = hold;
  }
  if (!hold) NotifyLater();
}

bool MemWatch::UnregisteringLocked(uintptr_t lo, uintptr_t hi) const {
  for (size_t i = 0; i < unregistering_count_; ++i) {
    if (unregistering_[i].lo < hi && unregistering_[i].hi > lo) return true;
  }
  return false;
}

void MemWatch::NotifyLater() {
  later_seq_.fetch_add(1, std::memory_order_acq_rel);
  FutexWake(&later_seq_, 1);
}

void MemWatch::UnwatcherLoop() {
  ScopedInsideLazypin inside;  // nothing it calls is lazypin's to intercept
  std::unique_lock<std::mutex> queue(later_mu_);
  for (;;) {
    if (!((later_count_ != 0 && !hold_later_) || stop_later_)) {
      // Waits without the lock (IdleWait: a program's handler may run here).
      const uint32_t seen = later_seq_.load(std::memory_order_acquire);
      queue.unlock();
      IdleWait(&later_seq_, seen);
      queue.lock();
      continue;
    }
    if (stop_later_) return;
    const Range r = later_[later_head_];
    later_head_ = (later_head_ + 1) % kLaterSlots;
    --later_count_;
    queue.unlock();
    Range pieces[kPieces];
    size_t n;
    {
      std::lock_guard<std::mutex> lock(mu_);
      n = UnwatchLocked(r.lo, r.hi, pieces, kPieces);
      for (size_t i = 0; i < n; ++i) unregistering_[i] = pieces[i];
      unregistering_count_ = n;
    }
    // Without mu_: a Watch elsewhere (a program's register) does not wait
    // for this page walk; one overlapping these pages does (Watch).
    for (size_t i = 0; i < n; ++i) Unregister(pieces[i].lo, pieces[i].hi);
    {
      std::lock_guard<std::mutex> lock(mu_);
      unregistering_count_ = 0;
    }
    unregistered_.notify_all();
    queue.lock();
  }
}

MemWatchCounters MemWatch::Counters() const {
  MemWatchCounters c;
  c.events = events_.load(std::memory_order_relaxed);
  c.overflows = overflows_.load(std::memory_order_relaxed);
  c.unexpected = unexpected_.load(std::memory_order_relaxed);
  c.watched_runs = watched_runs_.load(std::memory_order_relaxed);
  return c;
}

}  // namespace lazypin
