// descriptors: the few descriptors lazypin holds (the log file, the kernel
// watch's userfaultfd, the memory probe's files, /proc/self/pagemap) kept out
// of the program's way.
//
// Contract: a held descriptor sits at the top of the program's range
// (MoveFdHigh) and is used only while it still names the file lazypin opened
// (HeldFd::Ours): a program may dup2() onto any number, lazypin's included,
// and from then on that number is the program's. lazypin never reads, writes,
// polls or closes a number that is no longer its own.
#pragma once

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>

namespace lazypin {

// Moves `fd` (close-on-exec) to the highest free number below the soft
// RLIMIT_NOFILE, at most 1023, and returns the new number (or `fd` where
// none is free up there). open() hands out the lowest free number, so the
// program's own descriptors never meet it, and a program that lowers its
// limit later (below that number) can still open as many as bare.
inline int MoveFdHigh(int fd) {
  struct rlimit limit;
  if (fd < 0 || getrlimit(RLIMIT_NOFILE, &limit) != 0) return fd;
  const rlim_t top = limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur > 1024 ? 1024 : limit.rlim_cur;
  for (rlim_t at = top; at-- > static_cast<rlim_t>(fd) + 1 && at + 16 >= top;) {
    const int moved = fcntl(fd, F_DUPFD_CLOEXEC, static_cast<int>(at));
    if (moved >= 0) {
      close(fd);
      return moved;
    }
  }
  return fd;
}

// A descriptor lazypin opened, with the identity (device, inode) of its file.
// Ours() and get() may be called from any thread; Hold() and Close() by the
// owner, with no other call in progress.
class HeldFd {
 public:
  HeldFd() = default;
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
    dev_ = st.st_dev;
    ino_ = st.st_ino;
    fd_.store(MoveFdHigh(fd), std::memory_order_release);
    return true;
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
  // Whether `fd` names the same file as this one did (a reopened path).
  bool SameFile(int fd) const {
    struct stat st;
    return fd >= 0 && fstat(fd, &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_;
  }
  // Closes it if it is still lazypin's; forgets it either way.
  void Close() {
    if (Ours()) close(get());
    fd_.store(-1, std::memory_order_release);
  }

 private:
  std::atomic<int> fd_{-1};
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

}  // namespace lazypin
