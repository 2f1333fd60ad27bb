// descriptors: the few descriptors lazypin holds (the log file, the kernel
// watch's userfaultfd, the memory probe's files, /proc/self/pagemap) kept out
// of the program's way.
//
// Contract: a held descriptor sits at the top of the program's range
// (MoveFdHigh) and is used only while it still names the file lazypin opened
// (HeldFd::Ours): a program may dup2() onto any number, lazypin's included,
// and from then on that number is the program's. lazypin never reads, writes,
// polls or closes a number that is no longer its own.
//
// The program's dup2/dup3/close/close_range/closefrom (hooks_fds.cc) see
// lazypin's numbers as free: a dup2 onto one first moves lazypin's file to
// another high number (HeldFd::GiveUpNumber, which waits for a read or write
// in progress on it: HeldFd::Use), a close of one fails with EBADF and keeps
// it, a close_range skips them. A raw system call is caught by Ours() at the
// next use.
#pragma once

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <atomic>

namespace lazypin {

class HeldFd;
// The descriptors held now, for the descriptor hooks: a slot is set by
// HeldFd::Hold/Take and cleared by Close or the destructor.
inline constexpr int kMaxHeldFds = 8;
inline std::atomic<HeldFd*> g_held_fds[kMaxHeldFds];
inline std::atomic<int> g_held_fd_count{0};  // the hooks' fast path: zero, nothing held

// A copy of `fd` (close-on-exec) at the highest free number below the soft
// RLIMIT_NOFILE, at most 1023, within the top 16 and above `fd` (any but
// `avoid` with one); -1 where none is free up there.
inline int DupFdHigh(int fd, int avoid = -1) {
  struct rlimit limit;
  if (fd < 0 || getrlimit(RLIMIT_NOFILE, &limit) != 0) return -1;
  const rlim_t top = limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur > 1024 ? 1024 : limit.rlim_cur;
  const rlim_t floor = avoid >= 0 ? 0 : static_cast<rlim_t>(fd) + 1;
  for (rlim_t at = top; at-- > floor && at + 16 >= top;) {
    if (static_cast<int>(at) == avoid) continue;
    const int copy = fcntl(fd, F_DUPFD_CLOEXEC, static_cast<int>(at));
    if (copy >= 0) return copy;
  }
  return -1;
}

// Moves `fd` high (DupFdHigh) and returns the new number, or `fd` where none
// is free up there. open() hands out the lowest free number, so the
// program's own descriptors never meet it, and a program that lowers its
// limit later (below that number) can still open as many as bare.
inline int MoveFdHigh(int fd) {
  const int moved = DupFdHigh(fd);
  if (moved < 0) return fd;
  close(fd);
  return moved;
}

// A descriptor lazypin opened, with the identity (device, inode) of its file.
// Ours() and get() may be called from any thread; Hold() and Close() by the
// owner, with no other call in progress.
class HeldFd {
 public:
  HeldFd() = default;
  ~HeldFd() { Unlist(); }
  HeldFd(const HeldFd&) = delete;
  HeldFd& operator=(const HeldFd&) = delete;

  // Takes `fd` (just opened by lazypin), moved high; false (and `fd` closed)
  // when it cannot be identified.
  bool Hold(int fd) {
    struct stat st;
    if (fd < 0) return false;
    if (fstat(fd, &st) != 0) {
      close(fd);
      return false;
    }
    Take(MoveFdHigh(fd), st.st_dev, st.st_ino);
    return true;
  }
  // Takes `fd`, which lazypin opened (and moved high) earlier as the file
  // (dev, ino): held only while it still names that file, else forgotten
  // (the number is the program's).
  void Take(int fd, dev_t dev, ino_t ino) {
    dev_ = dev;
    ino_ = ino;
    fd_.store(fd, std::memory_order_release);
    List();
    Ours();
  }
  // The number, or -1; whether it is still lazypin's is Ours()'s to say.
  int get() const { return fd_.load(std::memory_order_acquire); }
  // True while the number names the file Hold() took: one fstat. A number
  // the program took over is forgotten (never closed: it is the program's).
  bool Ours() {
    const int fd = get();
    if (fd < 0) return false;
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_) return true;
    fd_.store(-1, std::memory_order_release);
    return false;
  }
  // Runs use(number) while the number is lazypin's; false (use not run) once
  // it is not. Uses run side by side and never wait for one another (a
  // program thread's use may be interrupted by a handler that waits for the
  // watch's reader); only a move or a close waits for them to end.
  template <typename Fn>
  bool Use(Fn&& use) {
    for (;;) {
      users_.fetch_add(1, std::memory_order_seq_cst);
      if (!exclusive_.load(std::memory_order_seq_cst)) break;
      users_.fetch_sub(1, std::memory_order_seq_cst);
      while (exclusive_.load(std::memory_order_acquire)) sched_yield();
    }
    const bool ours = Ours();
    if (ours) use(get());
    users_.fetch_sub(1, std::memory_order_release);
    return ours;
  }
  // The program is about to take `number` (dup2/dup3 onto it): where it is
  // this one's, the file moves to another high number (or is forgotten when
  // none is free) once no use is in progress.
  void GiveUpNumber(int number) {
    if (get() != number) return;
    Exclusive([&] {
      if (get() != number || !Ours()) return;
      const int moved = DupFdHigh(number, /*avoid=*/number);
      fd_.store(moved, std::memory_order_release);
      close(number);  // no longer held: the hook lets it through
    });
  }
  // Closes it if it is still lazypin's; forgets it either way.
  void Close() {
    Exclusive([&] {
      const int fd = Ours() ? get() : -1;
      fd_.store(-1, std::memory_order_release);
      if (fd >= 0) close(fd);  // no longer held: the hook lets it through
    });
    Unlist();
  }

 private:
  // Runs `change` with no use in progress: uses are single system calls, so
  // the wait is short; past 1 s (a use interrupted on this very thread by a
  // handler that got here) it goes ahead.
  template <typename Fn>
  void Exclusive(Fn&& change) {
    bool free_now = false;
    while (!exclusive_.compare_exchange_weak(free_now, true, std::memory_order_seq_cst)) {
      free_now = false;
      sched_yield();
    }
    for (int spins = 0; users_.load(std::memory_order_seq_cst) != 0 && spins < 100000; ++spins) {
      if (spins < 64) {
        sched_yield();
      } else {
        struct timespec pause = {0, 10000};
        nanosleep(&pause, nullptr);
      }
    }
    change();
    exclusive_.store(false, std::memory_order_release);
  }
  void List() {
    for (auto& slot : g_held_fds) {
      if (slot.load(std::memory_order_relaxed) == this) return;
    }
    for (auto& slot : g_held_fds) {
      HeldFd* empty = nullptr;
      if (slot.compare_exchange_strong(empty, this, std::memory_order_acq_rel)) {
        g_held_fd_count.fetch_add(1, std::memory_order_relaxed);
        return;
      }
    }
  }
  void Unlist() {
    for (auto& slot : g_held_fds) {
      HeldFd* self = this;
      if (slot.compare_exchange_strong(self, nullptr, std::memory_order_acq_rel)) {
        g_held_fd_count.fetch_sub(1, std::memory_order_relaxed);
      }
    }
  }

  std::atomic<int> fd_{-1};
  std::atomic<int> users_{0};          // Use calls in progress
  std::atomic<bool> exclusive_{false}; // a move or a close in progress
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

// For the descriptor hooks. Whether `number` is one lazypin holds now.
inline bool IsHeldNumber(int number) {
  if (g_held_fd_count.load(std::memory_order_relaxed) == 0 || number < 0) return false;
  for (auto& slot : g_held_fds) {
    HeldFd* held = slot.load(std::memory_order_acquire);
    if (held != nullptr && held->get() == number && held->Ours()) return true;
  }
  return false;
}
// The program takes `number`: each held descriptor on it moves away.
inline void GiveUpHeldNumber(int number) {
  if (g_held_fd_count.load(std::memory_order_relaxed) == 0 || number < 0) return;
  for (auto& slot : g_held_fds) {
    if (HeldFd* held = slot.load(std::memory_order_acquire)) held->GiveUpNumber(number);
  }
}
// Calls close(lo..hi) as `close_range` over [lo, hi] without the numbers
// lazypin holds (ascending runs between them); the first failure's result.
template <typename CloseRange>
int CloseRangeAroundHeld(unsigned lo, unsigned hi, CloseRange&& close_range) {
  if (g_held_fd_count.load(std::memory_order_relaxed) == 0) return close_range(lo, hi);
  int rc = 0;
  unsigned from = lo;
  for (;;) {
    unsigned next_held = ~0u;  // the lowest held number in [from, hi]
    for (auto& slot : g_held_fds) {
      HeldFd* held = slot.load(std::memory_order_acquire);
      const int n = held != nullptr ? held->get() : -1;
      if (n >= 0 && static_cast<unsigned>(n) >= from && static_cast<unsigned>(n) <= hi &&
          static_cast<unsigned>(n) < next_held && held->Ours()) {
        next_held = static_cast<unsigned>(n);
      }
    }
    if (next_held == ~0u) {
      const int last = close_range(from, hi);
      return rc != 0 ? rc : last;
    }
    if (next_held > from && rc == 0) rc = close_range(from, next_held - 1);
    if (next_held == hi) return rc;
    from = next_held + 1;
  }
}

}  // namespace lazypin

