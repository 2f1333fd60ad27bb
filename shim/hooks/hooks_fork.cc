// hooks_fork: the calls that copy the process without fork()'s handlers
// (syscall(SYS_fork), syscall(SYS_clone/SYS_clone3) and clone() without
// CLONE_VM, _Fork()) close the fork fence around the copy, so that no
// allocator lock of glibc's is copied held by one of lazypin's threads
// (base/fork_fence.h). Every other call is glibc's, unchanged.
#include <errno.h>
#include <linux/sched.h>
#include <sched.h>
#include <stdarg.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "export.h"
#include "fork_fence.h"
#include "real.h"

namespace lazypin {
namespace {

using SyscallFn = long (*)(long, ...);
using CloneFn = int (*)(int (*)(void*), void*, int, void*, ...);
using ForkFn = pid_t (*)();
real::Lazy<SyscallFn> g_syscall;
real::Lazy<CloneFn> g_clone;
real::Lazy<ForkFn> g_fork;

// A system call number and arguments that make a copy of the process.
bool CopiesProcess(long number, long a1) {
#ifdef SYS_fork
  if (number == SYS_fork) return true;
#endif
  if (number == SYS_clone) return (a1 & CLONE_VM) == 0;
#ifdef SYS_clone3
  if (number == SYS_clone3) {
    const auto* args = reinterpret_cast<const struct clone_args*>(a1);
    return args != nullptr && (args->flags & CLONE_VM) == 0;
  }
#endif
  return false;
}

// call(), the copy it makes fenced (fork_fence.h).
template <typename Call>
auto Fenced(Call call) {
  ForkFence::Close();
  const auto ret = call();
  ForkFence::Open();  // in the parent; in the copy, which has no thread of lazypin's, a no-op
  return ret;
}

// The system call itself, where glibc's wrapper is not known yet (a call
// from inside the lookup): glibc's convention, -1 and errno on failure.
long DirectSyscall(long n, long a1, long a2, long a3, long a4, long a5, long a6) {
#if defined(__x86_64__)
  long ret;
  register long r10 asm("r10") = a4;
  register long r8 asm("r8") = a5;
  register long r9 asm("r9") = a6;
  asm volatile("syscall"
               : "=a"(ret)
               : "a"(n), "D"(a1), "S"(a2), "d"(a3), "r"(r10), "r"(r8), "r"(r9)
               : "rcx", "r11", "memory");
#elif defined(__aarch64__)
  register long x8 asm("x8") = n;
  register long x0 asm("x0") = a1;
  register long x1 asm("x1") = a2;
  register long x2 asm("x2") = a3;
  register long x3 asm("x3") = a4;
  register long x4 asm("x4") = a5;
  register long x5 asm("x5") = a6;
  asm volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5) : "memory");
  const long ret = x0;
#else
  (void)n, (void)a1, (void)a2, (void)a3, (void)a4, (void)a5, (void)a6;
  const long ret = -ENOSYS;
#endif
  if (ret < 0 && ret > -4096) {
    errno = static_cast<int>(-ret);
    return -1;
  }
  return ret;
}

}  // namespace
}  // namespace lazypin

using namespace lazypin;  // NOLINT: the hooks below are C symbols

LAZYPIN_EXPORT long syscall(long number, ...) {
  va_list ap;
  va_start(ap, number);
  long a[6];
  for (long& arg : a) arg = va_arg(ap, long);  // glibc's wrapper reads six, always
  va_end(ap);
  SyscallFn real = g_syscall.Peek();
  if (real == nullptr && !real::Resolving()) real = g_syscall.Get(&real::Next, "syscall");
  const auto call = [&] {
    return real != nullptr ? real(number, a[0], a[1], a[2], a[3], a[4], a[5])
                           : DirectSyscall(number, a[0], a[1], a[2], a[3], a[4], a[5]);
  };
  return CopiesProcess(number, a[0]) ? Fenced(call) : call();
}

static int CloneHook(int (*fn)(void*), void* stack, int flags, void* arg, va_list ap) {
  void* parent_tid = va_arg(ap, void*);  // read as glibc's wrapper reads them
  void* tls = va_arg(ap, void*);
  void* child_tid = va_arg(ap, void*);
  CloneFn real = g_clone.Get(&real::Next, "clone");
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  const auto call = [&] { return real(fn, stack, flags, arg, parent_tid, tls, child_tid); };
  return (flags & CLONE_VM) ? call() : Fenced(call);  // the copy starts in fn, never here
}

LAZYPIN_EXPORT int clone(int (*fn)(void*), void* stack, int flags, void* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  const int ret = CloneHook(fn, stack, flags, arg, ap);
  va_end(ap);
  return ret;
}

// glibc's other name for clone, the same function.
LAZYPIN_EXPORT int __clone(int (*fn)(void*), void* stack, int flags, void* arg, ...)
    __attribute__((alias("clone")));

LAZYPIN_EXPORT pid_t _Fork() {
  ForkFn real = g_fork.Get(&real::Next, "_Fork");
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  return Fenced(real);
}
