// sys: the few system primitives every layer uses, defined once: the
// monotonic and wall clocks, a futex wait and wake on a 32-bit word, and
// reading a small file (procfs, sysfs). Async-signal-safe but for
// ReadSmallFile's std::string form.
#pragma once

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace lazypin {

// CLOCK_MONOTONIC in nanoseconds: every duration lazypin measures.
inline int64_t MonotonicNs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// CLOCK_MONOTONIC_COARSE: the last tick's time (1-4 ms resolution), a few
// nanoseconds to read; for ages measured in seconds.
inline int64_t CoarseMonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// CLOCK_REALTIME in nanoseconds: when a log started, for people.
inline int64_t UnixNs() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// Sleeps while `*word == seen`, at most `timeout_ns` (< 0: no bound); returns
// on a wake, a timeout, a signal or a changed word: the caller re-checks.
inline void FutexWait(const void* word, uint32_t seen, int64_t timeout_ns = -1) {
  struct timespec timeout = {timeout_ns / 1000000000, timeout_ns % 1000000000};
  syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, seen, timeout_ns >= 0 ? &timeout : nullptr,
          nullptr, 0);
}

// Wakes up to `count` threads waiting on `word`.
inline void FutexWake(const void* word, int count) {
  syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, count, nullptr, nullptr, 0);
}

// Up to `size - 1` bytes of `path`, NUL-terminated; false when it cannot be
// opened or read. No allocation (for hooks and signal handlers).
inline bool ReadSmallFile(const char* path, char* buf, size_t size) {
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const ssize_t n = read(fd, buf, size - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  return true;
}

// All of `path` up to 1 MiB ("" when unreadable).
inline std::string ReadSmallFile(const char* path) {
  std::string out;
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0 && out.size() < (1 << 20)) out.append(buf, n);
  close(fd);
  return out;
}

}  // namespace lazypin
