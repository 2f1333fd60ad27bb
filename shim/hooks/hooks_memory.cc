// hooks_memory: every path by which memory leaves the process tells the
// MemoryGuard first, then calls the real function. Each
// hook is its fast path (the published state, its guard, and whether
// anything is pooled: null unless deferring) and one call into the guard.
// glibc's free and realloc unmap or trim memory internally, where no PLT hook
// sees it, so free/realloc report the whole block they release.
#include "hooks_memory.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include <linux/ioctl.h>
#include <linux/userfaultfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include "hooks_alloc.h"
#include "memory_budget.h"
#include "memory_guard.h"
#include "page_class.h"
#include "pages.h"
#include "real.h"
#include "export.h"
#include "state.h"
#include "thread_state.h"

namespace lazypin {
namespace {

using FreeFn = void (*)(void*);
using ReallocFn = void* (*)(void*, size_t);
using ReallocarrayFn = void* (*)(void*, size_t, size_t);
using MunmapFn = int (*)(void*, size_t);
using MremapFn = void* (*)(void*, size_t, size_t, int, ...);
using MmapFn = void* (*)(void*, size_t, int, int, int, off_t);
using MadviseFn = int (*)(void*, size_t, int);
using BrkFn = int (*)(void*);
using SbrkFn = void* (*)(intptr_t);
using ShmdtFn = int (*)(const void*);
using ShmatFn = void* (*)(int, const void*, int);
using MprotectFn = int (*)(void*, size_t, int);
using PkeyMprotectFn = int (*)(void*, size_t, int, int);
using MincoreFn = int (*)(void*, size_t, unsigned char*);
using MlockFn = int (*)(const void*, size_t);
using Mlock2Fn = int (*)(const void*, size_t, unsigned int);
using MsyncFn = int (*)(void*, size_t, int);
using IoctlFn = int (*)(int, unsigned long, ...);

real::Lazy<FreeFn> g_free;
real::Lazy<ReallocFn> g_realloc;
real::Lazy<ReallocarrayFn> g_reallocarray;
real::Lazy<MunmapFn> g_munmap;
real::Lazy<MremapFn> g_mremap;
real::Lazy<MmapFn> g_mmap;
real::Lazy<MmapFn> g_mmap64;
real::Lazy<MadviseFn> g_madvise;
real::Lazy<BrkFn> g_brk;
real::Lazy<SbrkFn> g_sbrk;
real::Lazy<ShmdtFn> g_shmdt;
real::Lazy<ShmatFn> g_shmat;
real::Lazy<MprotectFn> g_mprotect;
real::Lazy<PkeyMprotectFn> g_pkey_mprotect;
real::Lazy<MincoreFn> g_mincore;
real::Lazy<MlockFn> g_mlock;
real::Lazy<Mlock2Fn> g_mlock2;
real::Lazy<MlockFn> g_munlock;
real::Lazy<MsyncFn> g_msync;
real::Lazy<IoctlFn> g_ioctl;

thread_local int t_selftest_hits LAZYPIN_TLS = 0;

uintptr_t Addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// The guard if something is pooled; else null (the fast path).
inline const MemoryGuard* Guard() {
  const MemoryGuard* guard = PublishedGuard();
  return guard != nullptr && guard->Holding() ? guard : nullptr;
}

void BlockLeaving(const void* ptr, EvictReason reason) {
  if (ptr == nullptr) return;
  if (const MemoryGuard* guard = Guard()) {
    const uintptr_t lo = Addr(ptr);
    if (const size_t bytes = guard->BlockBytes(ptr); bytes != 0) guard->Leaving(lo, lo + bytes, reason);
  }
}

void RangeLeaving(const void* addr, size_t len, EvictReason reason) {
  if (len == 0) return;
  if (const MemoryGuard* guard = Guard()) {
    guard->Leaving(Addr(addr), PageCeil(RangeEnd(Addr(addr), len)), reason);
  }
}

// A memory call that acts on the range without releasing it: a block the
// program freed with cudaFreeHost and the cache keeps there is freed first.
void RangeTouching(const void* addr, size_t len, EvictReason reason) {
  if (len == 0) return;
  if (const MemoryGuard* guard = Guard()) {
    guard->Touching(Addr(addr), PageCeil(RangeEnd(Addr(addr), len)), reason);
  }
}

// The span of the SysV segment attached at `addr` (shmdt says only where it
// starts): the shared mappings that follow each other from there, so a
// segment split by mprotect counts whole (a neighbour mapped right after it
// counts too: invalidating more is safe). Allocates nothing.
size_t SegmentSizeAt(const void* addr) {
  uintptr_t end = Addr(addr);
  ForEachMapping(Addr(addr), ~uintptr_t{0}, [&](const Mapping& m) {
    if (m.lo != end || !m.shared) return false;
    end = m.hi;
    return true;
  });
  return end - Addr(addr);
}

}  // namespace

bool MemoryHooksSelfTest(std::string* why) {
  real::DlsymFn dlsym_real = real::Dlsym();
  if (dlsym_real == nullptr) {
    *why = "glibc's dlsym was not found";
    return false;
  }
  Dl_info self;
  if (dladdr(reinterpret_cast<void*>(&MemoryHooksSelfTest), &self) == 0) {
    *why = "dladdr failed";
    return false;
  }
  // The calls that hand memory back to the kernel must reach our hooks.
  for (const char* name : {"munmap", "mremap", "mmap", "madvise"}) {
    void* global = dlsym_real(RTLD_DEFAULT, name);
    Dl_info info;
    if (global == nullptr || dladdr(global, &info) == 0 || info.dli_fbase != self.dli_fbase) {
      *why = std::string("the process's ") + name + " is not lazypin's but " +
             (global != nullptr && dladdr(global, &info) && info.dli_fname ? info.dli_fname : "?") +
             " (a library that defines it is preloaded before lazypin)";
      return false;
    }
  }
  // free and realloc must be ours when they are glibc's: glibc's own free
  // unmaps and trims memory internally, where no hook sees it. Another
  // allocator (jemalloc, tcmalloc, a wrapper) returns memory to the kernel
  // through the hooks above.
  for (const char* name : {"free", "realloc"}) {
    void* global = dlsym_real(RTLD_DEFAULT, name);
    Dl_info info;
    if (global == nullptr || dladdr(global, &info) == 0) {
      *why = std::string("the process's ") + name + " was not found";
      return false;
    }
    if (info.dli_fbase != self.dli_fbase && info.dli_fname != nullptr &&
        strstr(info.dli_fname, "libc.so") != nullptr) {
      *why = std::string("the process's ") + name + " is glibc's, not lazypin's";
      return false;
    }
  }
  // Fire one: a munmap through the global symbol must reach the hook.
  auto global_munmap = reinterpret_cast<MunmapFn>(dlsym_real(RTLD_DEFAULT, "munmap"));
  void* page = g_mmap.Get(&real::Next, "mmap")(nullptr, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) {
    *why = "mmap failed";
    return false;
  }
  const int before = t_selftest_hits;
  global_munmap(page, 4096);
  if (t_selftest_hits == before) {
    *why = "a munmap through the global symbol did not reach lazypin's hook";
    return false;
  }
  return true;
}

}  // namespace lazypin

using namespace lazypin;  // NOLINT: the hooks below are C symbols

LAZYPIN_EXPORT void free(void* ptr) {
  if (real::Resolving()) return;  // the loader's own allocation during our lookup: leak it
  if (InBootstrapArena(ptr)) return;  // hooks_alloc's arena: never the allocator's
  if (ptr != nullptr) {
    if (const MemoryGuard* guard = Guard(); guard != nullptr && guard->TakeFree(ptr)) return;
  }
  RealFree(ptr);
}

void lazypin::RealFree(void* ptr) {
  if (FreeFn real = g_free.Get(&real::Next, "free")) CallAllocator(real, ptr);
}

LAZYPIN_EXPORT void cfree(void* ptr) { free(ptr); }

LAZYPIN_EXPORT void* realloc(void* ptr, size_t size) {
  if (ptr == nullptr && g_alloc_gauge.load(std::memory_order_relaxed) != 0) {
    if (void* block = ServeParked(size, 0, false)) return block;  // realloc(NULL, n) is malloc(n)
  }
  if (InBootstrapArena(ptr)) {
    void* moved = malloc(size);
    if (moved != nullptr) memcpy(moved, ptr, std::min(size, BootstrapSize(ptr)));
    return moved;
  }
  BlockLeaving(ptr, EvictReason::kRealloc);
  ReallocFn real = g_realloc.Get(&real::Next, "realloc");
  if (real == nullptr) {
    errno = ENOMEM;
    return nullptr;
  }
  return CallAllocator(real, ptr, size);
}

LAZYPIN_EXPORT void* reallocarray(void* ptr, size_t n, size_t size) {
  BlockLeaving(ptr, EvictReason::kRealloc);
  ReallocarrayFn real = g_reallocarray.Get(&real::Next, "reallocarray");
  if (real == nullptr) {
    errno = ENOMEM;
    return nullptr;
  }
  return CallAllocator(real, ptr, n, size);
}

LAZYPIN_EXPORT int munmap(void* addr, size_t len) {
  ++t_selftest_hits;
  RangeLeaving(addr, len, EvictReason::kMunmap);
  if (MunmapFn real = g_munmap.Get(&real::Next, "munmap")) return real(addr, len);
  return static_cast<int>(syscall(SYS_munmap, addr, len));
}

LAZYPIN_EXPORT void* mremap(void* old_addr, size_t old_size, size_t new_size, int flags, ...) {
  void* new_addr = nullptr;
  if (flags & MREMAP_FIXED) {
    va_list ap;
    va_start(ap, flags);
    new_addr = va_arg(ap, void*);
    va_end(ap);
    RangeLeaving(new_addr, new_size, EvictReason::kMremap);
  }
  RangeLeaving(old_addr, old_size, EvictReason::kMremap);
  if (MremapFn real = g_mremap.Get(&real::Next, "mremap")) {
    return real(old_addr, old_size, new_size, flags, new_addr);
  }
  return reinterpret_cast<void*>(syscall(SYS_mremap, old_addr, old_size, new_size, flags, new_addr));
}

static void* MmapHook(real::Lazy<MmapFn>& lazy, const char* name, void* addr, size_t len,
                      int prot, int flags, int fd, off_t offset) {
  if ((flags & MAP_FIXED_NOREPLACE) == MAP_FIXED_NOREPLACE) {
    // Fails over a mapping: memory the program freed and lazypin keeps
    // mapped (a parked block, a kept host block) must not be one.
    if (len != 0) {
      if (const MemoryGuard* guard = Guard()) {
        guard->Reclaiming(Addr(addr), PageCeil(RangeEnd(Addr(addr), len)));
      }
    }
  } else if (flags & MAP_FIXED) {
    RangeLeaving(addr, len, EvictReason::kMmapFixed);
  }
  // Memory committed now: kept memory yields first (a plain mapping is only
  // address space until touched: the collector's poll covers that).
  if ((flags & MAP_POPULATE) && len >= MemoryBudget::kAnnounceMin &&
      g_alloc_gauge.load(std::memory_order_relaxed) != 0) {
    AnnounceAllocation(len);
  }
  const int saved_errno = errno;
  MmapFn real = lazy.Get(&real::Next, name);
  auto map = [&] {
    return real != nullptr ? real(addr, len, prot, flags, fd, offset)
                           : reinterpret_cast<void*>(syscall(SYS_mmap, addr, len, prot, flags, fd, offset));
  };
  void* p = map();
  if (p == MAP_FAILED && errno == ENOMEM && RetryAfterRelease(saved_errno, len)) p = map();
  return p;
}

LAZYPIN_EXPORT void* mmap(void* addr, size_t len, int prot, int flags, int fd, off_t offset) {
  return MmapHook(g_mmap, "mmap", addr, len, prot, flags, fd, offset);
}

LAZYPIN_EXPORT void* mmap64(void* addr, size_t len, int prot, int flags, int fd, off_t offset) {
  return MmapHook(g_mmap64, "mmap64", addr, len, prot, flags, fd, offset);
}

LAZYPIN_EXPORT int madvise(void* addr, size_t len, int advice) {
  constexpr int kDontneedLocked = 24;  // MADV_DONTNEED_LOCKED, Linux 5.18
  constexpr int kGuardInstall = 102;   // MADV_GUARD_INSTALL, Linux 6.13: zaps with no uffd event
  constexpr int kGuardRemove = 103;
  if (advice == MADV_DONTNEED || advice == MADV_FREE || advice == MADV_REMOVE ||
      advice == kDontneedLocked || advice == kGuardInstall || advice == kGuardRemove) {
    RangeLeaving(addr, len, EvictReason::kMadvise);
  } else {
    RangeTouching(addr, len, EvictReason::kMadvise);
  }
  if (MadviseFn real = g_madvise.Get(&real::Next, "madvise")) return real(addr, len, advice);
  return static_cast<int>(syscall(SYS_madvise, addr, len, advice));
}

LAZYPIN_EXPORT int brk(void* addr) {
  SbrkFn sbrk_real = g_sbrk.Get(&real::Next, "sbrk");
  const MemoryGuard* guard = Guard();
  if (guard != nullptr && sbrk_real != nullptr) {
    const uintptr_t current = Addr(sbrk_real(0));
    if (Addr(addr) < current) guard->Leaving(Addr(addr), current, EvictReason::kBrk);
  }
  BrkFn real = g_brk.Get(&real::Next, "brk");
  if (real == nullptr) {
    errno = ENOMEM;
    return -1;
  }
  return real(addr);
}

LAZYPIN_EXPORT void* sbrk(intptr_t increment) {
  SbrkFn real = g_sbrk.Get(&real::Next, "sbrk");
  if (real == nullptr) {
    errno = ENOMEM;
    return reinterpret_cast<void*>(-1);
  }
  const MemoryGuard* guard = increment < 0 ? Guard() : nullptr;
  if (guard != nullptr) {
    const uintptr_t current = Addr(real(0));
    guard->Leaving(current + increment, current, EvictReason::kBrk);
  }
  return real(increment);
}

LAZYPIN_EXPORT int shmdt(const void* addr) {
  if (const MemoryGuard* guard = Guard()) {
    const size_t size = SegmentSizeAt(addr);
    // Unknown size: release everything pooled at or above the address.
    guard->Leaving(Addr(addr), size ? Addr(addr) + size : ~uintptr_t{0}, EvictReason::kShmdt);
  }
  ShmdtFn real = g_shmdt.Get(&real::Next, "shmdt");
  if (real == nullptr) return static_cast<int>(syscall(SYS_shmdt, addr));
  return real(addr);
}

LAZYPIN_EXPORT void* shmat(int id, const void* addr, int flags) {
  const MemoryGuard* guard = (flags & SHM_REMAP) && addr != nullptr ? Guard() : nullptr;
  if (guard != nullptr) {
    struct shmid_ds ds;
    const size_t size = shmctl(id, IPC_STAT, &ds) == 0 ? ds.shm_segsz : 0;
    // SHM_RND: the kernel attaches at the address rounded down to SHMLBA.
    const uintptr_t at = (flags & SHM_RND) ? Addr(addr) & ~(uintptr_t{SHMLBA} - 1) : Addr(addr);
    guard->Leaving(at, size ? PageCeil(RangeEnd(at, size)) : ~uintptr_t{0}, EvictReason::kShmat);
  }
  ShmatFn real = g_shmat.Get(&real::Next, "shmat");
  if (real == nullptr) return reinterpret_cast<void*>(syscall(SYS_shmat, id, addr, flags));
  return real(id, addr, flags);
}

// Less access than read and write: the driver refuses to register such
// memory, so a pooled registration there must not answer for it.
static void RangeProtecting(const void* addr, size_t len, int prot) {
  if (len == 0) return;
  if (const MemoryGuard* guard = Guard()) {
    guard->Protecting(Addr(addr), PageCeil(RangeEnd(Addr(addr), len)), prot);
  }
}

LAZYPIN_EXPORT int mprotect(void* addr, size_t len, int prot) {
  RangeProtecting(addr, len, prot);
  if (MprotectFn real = g_mprotect.Get(&real::Next, "mprotect")) return real(addr, len, prot);
  return static_cast<int>(syscall(SYS_mprotect, addr, len, prot));
}

LAZYPIN_EXPORT int pkey_mprotect(void* addr, size_t len, int prot, int pkey) {
  RangeProtecting(addr, len, prot);
  if (PkeyMprotectFn real = g_pkey_mprotect.Get(&real::Next, "pkey_mprotect")) {
    return real(addr, len, prot, pkey);
  }
  return static_cast<int>(syscall(SYS_pkey_mprotect, addr, len, prot, pkey));
}

// Address-space limits the headroom counts (memory_limit.h): a program that
// lowers one gets everything lazypin keeps released before the new limit
// applies, so that the driver's frees never run short of address space and
// the program's next allocation finds what it would bare. glibc's setrlimit
// makes the system call itself, so each entry point is hooked.
namespace {
using SetrlimitFn = int (*)(__rlimit_resource_t, const struct rlimit*);
using PrlimitFn = int (*)(pid_t, enum __rlimit_resource, const struct rlimit*, struct rlimit*);
real::Lazy<SetrlimitFn> g_setrlimit, g_setrlimit64;
real::Lazy<PrlimitFn> g_prlimit, g_prlimit64;

void BeforeLimit(pid_t pid, int resource, const struct rlimit* limit) {
  if (limit == nullptr || (resource != RLIMIT_AS && resource != RLIMIT_DATA) ||
      (pid != 0 && pid != getpid()) || g_alloc_gauge.load(std::memory_order_relaxed) == 0) {
    return;
  }
  const int saved_errno = errno;
  struct rlimit now;
  if (getrlimit(static_cast<__rlimit_resource_t>(resource), &now) == 0 && limit->rlim_cur < now.rlim_cur) {
    if (const MemoryGuard* guard = Guard()) guard->ReleaseKept();
  }
  errno = saved_errno;
}

int RealPrlimit(real::Lazy<PrlimitFn>& lazy, const char* name, pid_t pid, enum __rlimit_resource resource,
                const struct rlimit* limit, struct rlimit* old) {
  if (PrlimitFn real = lazy.Get(&real::Next, name)) return real(pid, resource, limit, old);
  return static_cast<int>(syscall(SYS_prlimit64, pid, resource, limit, old));
}
}  // namespace

LAZYPIN_EXPORT int setrlimit(__rlimit_resource_t resource, const struct rlimit* limit) {
  BeforeLimit(0, resource, limit);
  if (SetrlimitFn real = g_setrlimit.Get(&real::Next, "setrlimit")) return real(resource, limit);
  return RealPrlimit(g_prlimit, "prlimit", 0, static_cast<enum __rlimit_resource>(resource), limit, nullptr);
}

LAZYPIN_EXPORT int setrlimit64(__rlimit_resource_t resource, const struct rlimit64* limit) {
  const auto* same = reinterpret_cast<const struct rlimit*>(limit);  // one layout on 64-bit Linux
  BeforeLimit(0, resource, same);
  if (SetrlimitFn real = g_setrlimit64.Get(&real::Next, "setrlimit64")) return real(resource, same);
  return RealPrlimit(g_prlimit64, "prlimit64", 0, static_cast<enum __rlimit_resource>(resource), same, nullptr);
}

LAZYPIN_EXPORT int prlimit(pid_t pid, enum __rlimit_resource resource, const struct rlimit* limit,
                           struct rlimit* old) {
  BeforeLimit(pid, resource, limit);
  return RealPrlimit(g_prlimit, "prlimit", pid, resource, limit, old);
}

LAZYPIN_EXPORT int prlimit64(pid_t pid, enum __rlimit_resource resource, const struct rlimit64* limit,
                             struct rlimit64* old) {
  const auto* same = reinterpret_cast<const struct rlimit*>(limit);
  BeforeLimit(pid, resource, same);
  return RealPrlimit(g_prlimit64, "prlimit64", pid, resource, same, reinterpret_cast<struct rlimit*>(old));
}

// Calls that act on memory without releasing it (each fails on unmapped
// memory): a kept host block there is freed first (MemoryGuard::Touching).
LAZYPIN_EXPORT int mincore(void* addr, size_t len, unsigned char* vec) {
  RangeTouching(addr, len, EvictReason::kMemoryCall);
  if (MincoreFn real = g_mincore.Get(&real::Next, "mincore")) return real(addr, len, vec);
  return static_cast<int>(syscall(SYS_mincore, addr, len, vec));
}

LAZYPIN_EXPORT int mlock(const void* addr, size_t len) {
  RangeTouching(addr, len, EvictReason::kMemoryCall);
  if (MlockFn real = g_mlock.Get(&real::Next, "mlock")) return real(addr, len);
  return static_cast<int>(syscall(SYS_mlock, addr, len));
}

LAZYPIN_EXPORT int mlock2(const void* addr, size_t len, unsigned int flags) {
  RangeTouching(addr, len, EvictReason::kMemoryCall);
  if (Mlock2Fn real = g_mlock2.Get(&real::Next, "mlock2")) return real(addr, len, flags);
  return static_cast<int>(syscall(SYS_mlock2, addr, len, flags));
}

LAZYPIN_EXPORT int munlock(const void* addr, size_t len) {
  RangeTouching(addr, len, EvictReason::kMemoryCall);
  if (MlockFn real = g_munlock.Get(&real::Next, "munlock")) return real(addr, len);
  return static_cast<int>(syscall(SYS_munlock, addr, len));
}

LAZYPIN_EXPORT int msync(void* addr, size_t len, int flags) {
  RangeTouching(addr, len, EvictReason::kMemoryCall);
  if (MsyncFn real = g_msync.Get(&real::Next, "msync")) return real(addr, len, flags);
  return static_cast<int>(syscall(SYS_msync, addr, len, flags));
}

// Only UFFDIO_REGISTER is looked at (one comparison for every other request,
// the driver's own among them): the kernel lets one userfaultfd register a
// range, so lazypin's watch lets go of the program's range first
// (MemoryGuard::YieldingWatch). lazypin's own register runs inside its code,
// where the guard passes.
LAZYPIN_EXPORT int ioctl(int fd, unsigned long request, ...) {
  va_list ap;
  va_start(ap, request);
  void* arg = va_arg(ap, void*);
  va_end(ap);
  if (__builtin_expect(request == UFFDIO_REGISTER, 0) && arg != nullptr) {
    if (const MemoryGuard* guard = Guard()) {
      uffdio_range range;
      memcpy(&range, &static_cast<const uffdio_register*>(arg)->range, sizeof range);
      if (range.len != 0) {
        guard->YieldingWatch(PageFloor(range.start), PageCeil(RangeEnd(range.start, range.len)));
      }
    }
  }
  if (IoctlFn real = g_ioctl.Get(&real::Next, "ioctl")) return real(fd, request, arg);
  return static_cast<int>(syscall(SYS_ioctl, fd, request, arg));
}
