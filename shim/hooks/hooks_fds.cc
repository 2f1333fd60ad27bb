// hooks_fds: the program's dup2/dup3/close/close_range/closefrom see the
// numbers lazypin holds as free ones (base/descriptors.h): a dup2 onto one
// moves lazypin's file away first, a close of one fails as for a closed
// number, a close_range leaves them open. Every other call is glibc's.
#include <errno.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "descriptors.h"
#include "export.h"
#include "real.h"

namespace lazypin {
namespace {

using Dup2Fn = int (*)(int, int);
using Dup3Fn = int (*)(int, int, int);
using CloseFn = int (*)(int);
using CloseRangeFn = int (*)(unsigned, unsigned, int);
using ClosefromFn = void (*)(int);
real::Lazy<Dup2Fn> g_dup2;
real::Lazy<Dup3Fn> g_dup3;
real::Lazy<CloseFn> g_close;
real::Lazy<CloseRangeFn> g_close_range;

int RealCloseRange(unsigned lo, unsigned hi, int flags) {
  if (CloseRangeFn real = g_close_range.Get(&real::Next, "close_range")) return real(lo, hi, flags);
  return static_cast<int>(syscall(SYS_close_range, lo, hi, flags));
}

}  // namespace
}  // namespace lazypin

using namespace lazypin;  // NOLINT: the hooks below are C symbols

LAZYPIN_EXPORT int dup2(int from, int to) {
  if (from != to) GiveUpHeldNumber(to);
  if (Dup2Fn real = g_dup2.Get(&real::Next, "dup2")) return real(from, to);
  if (from == to) return fcntl(from, F_GETFD) < 0 ? -1 : to;  // dup2's answer; dup3 would say EINVAL
  return static_cast<int>(syscall(SYS_dup3, from, to, 0));
}

LAZYPIN_EXPORT int dup3(int from, int to, int flags) {
  if (from != to) GiveUpHeldNumber(to);
  if (Dup3Fn real = g_dup3.Get(&real::Next, "dup3")) return real(from, to, flags);
  return static_cast<int>(syscall(SYS_dup3, from, to, flags));
}

LAZYPIN_EXPORT int close(int fd) {
  if (__builtin_expect(IsHeldNumber(fd), 0)) {
    errno = EBADF;  // as for a number the program never opened
    return -1;
  }
  if (CloseFn real = g_close.Get(&real::Next, "close")) return real(fd);
  return static_cast<int>(syscall(SYS_close, fd));
}

LAZYPIN_EXPORT int close_range(unsigned lo, unsigned hi, int flags) {
  if (lo > hi) return RealCloseRange(lo, hi, flags);  // glibc's EINVAL
  return CloseRangeAroundHeld(lo, hi, [flags](unsigned a, unsigned b) { return RealCloseRange(a, b, flags); });
}

LAZYPIN_EXPORT void closefrom(int lo) {
  // glibc's closefrom closes through an internal close_range: never the hook.
  if (lo < 0) lo = 0;
  const int saved_errno = errno;
  CloseRangeAroundHeld(static_cast<unsigned>(lo), ~0u, [](unsigned a, unsigned b) {
    return RealCloseRange(a, b, 0);
  });
  errno = saved_errno;
}
