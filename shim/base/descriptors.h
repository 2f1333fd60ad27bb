// descriptors: the few descriptors lazypin holds (the log file, the kernel
// watch's userfaultfd) kept out of the program's way.
#pragma once

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

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

}  // namespace lazypin
