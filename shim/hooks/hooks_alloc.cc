// hooks_alloc: the allocation hooks (see hooks_alloc.h).
//
// Early and reentrant calls: the loader calls malloc/calloc once relocation
// is done, before any constructor of lazypin's; the next definition is looked
// up on the first call (real::Lazy), and an allocation made by that lookup
// itself (dlsym may calloc) comes from a static arena that free and realloc
// recognise. A thread inside lazypin's own code (which may hold the pool's
// lock) is never served a parked block (MemoryGuard::Serve).
#include "hooks_alloc.h"

#include <dlfcn.h>
#include <link.h>
#include <errno.h>
#include <malloc.h>
#include <string.h>

#include "glibc_blocks.h"
#include "memory_budget.h"
#include "memory_guard.h"
#include "pages.h"
#include "real.h"
#include "export.h"
#include "hooks.h"
#include "hooks_memory.h"
#include "thread_state.h"
#include "zero_fill.h"

namespace lazypin {

std::atomic<int64_t> g_alloc_gauge{0};
const HookSide kHookSide{&MemoryHooksSelfTest, &AllocatorReuseCheck, &RealFree, &g_alloc_gauge};

namespace {


using MallocFn = void* (*)(size_t);
using CallocFn = void* (*)(size_t, size_t);
using PosixMemalignFn = int (*)(void**, size_t, size_t);
using AlignFn = void* (*)(size_t, size_t);
using MalloptFn = int (*)(int, int);

real::Lazy<MallocFn> g_malloc;
real::Lazy<CallocFn> g_calloc;
real::Lazy<PosixMemalignFn> g_posix_memalign;
real::Lazy<AlignFn> g_aligned_alloc;
real::Lazy<AlignFn> g_memalign;
real::Lazy<MallocFn> g_valloc;
real::Lazy<MallocFn> g_pvalloc;
real::Lazy<MalloptFn> g_mallopt;

constexpr size_t kArenaBytes = size_t{256} << 10;
constexpr size_t kArenaHeader = 16;
alignas(4096) char g_arena[kArenaBytes];
std::atomic<size_t> g_arena_used{0};

// The fast path's one load: nothing parked nor kept.
inline bool AnyParked() { return g_alloc_gauge.load(std::memory_order_relaxed) != 0; }
// Blocks are parked (the gauge's low 32 bits).
inline bool Parked() { return (g_alloc_gauge.load(std::memory_order_relaxed) & 0xffffffff) != 0; }
// Kept memory yields first to a large allocation.
inline void MaybeAnnounce(size_t bytes) {
  if (bytes >= MemoryBudget::kAnnounceMin && AnyParked()) AnnounceAllocation(bytes);
}
inline bool PowerOfTwo(size_t a) { return a != 0 && (a & (a - 1)) == 0; }

// The real function, or null while it is being looked up on this thread
// (then the caller uses the arena).
template <typename Fn>
Fn RealOrNull(real::Lazy<Fn>& lazy, const char* name) {
  if (Fn fn = lazy.Peek()) return fn;
  if (real::Resolving()) return nullptr;
  return lazy.Get(&real::Next, name);
}

// Every free of the program's done and every parked block released (the
// collector unregisters and frees it) before the call returns; errno as it was.
void ReleaseParked() {
  const MemoryGuard* guard = PublishedGuard();
  if (guard == nullptr) return;
  const int saved_errno = errno;
  guard->ReleaseParked();
  errno = saved_errno;
}
}  // namespace

bool RetryAfterRelease(int saved_errno, size_t bytes) {
  if (!AnyParked() || bytes >= (~size_t{0} >> 2)) return false;  // no release makes that fit
  const MemoryGuard* guard = PublishedGuard();
  if (guard == nullptr || !guard->ReleaseKept()) return false;
  errno = saved_errno;
  return true;
}

bool InBootstrapArena(const void* ptr) {
  const char* p = static_cast<const char*>(ptr);
  return p >= g_arena && p < g_arena + kArenaBytes;
}

void* BootstrapAlloc(size_t bytes, size_t align) {
  if (align < kArenaHeader) align = kArenaHeader;
  if (bytes > kArenaBytes || !PowerOfTwo(align)) return nullptr;
  size_t used = g_arena_used.load(std::memory_order_relaxed);
  for (;;) {
    const size_t start = (used + kArenaHeader + align - 1) & ~(align - 1);
    const size_t end = start + ((bytes + 15) & ~size_t{15});
    if (end > kArenaBytes) return nullptr;  // ENOMEM for the loader: never seen in practice
    if (g_arena_used.compare_exchange_weak(used, end, std::memory_order_relaxed)) {
      memcpy(g_arena + start - kArenaHeader, &bytes, sizeof bytes);
      return g_arena + start;  // zero: the arena is never reused
    }
  }
}

size_t BootstrapSize(const void* ptr) {
  size_t bytes;
  memcpy(&bytes, static_cast<const char*>(ptr) - kArenaHeader, sizeof bytes);
  return bytes;
}

void AnnounceAllocation(size_t bytes) {
  if (const MemoryGuard* guard = PublishedGuard()) guard->MakeRoomFor(bytes);
}

void* ServeParked(size_t bytes, size_t align, bool zero) {
  const MemoryGuard* guard = PublishedGuard();
  bool zeroed = false;
  void* block = guard != nullptr ? guard->Serve(bytes, align, &zeroed) : nullptr;
  if (block != nullptr && !zeroed) {
    const GlibcChunk chunk = GlibcChunkOf(block, PageSize());
    if (zero || chunk.mmapped) ZeroForProgram(block, chunk.usable);
  }
  return block;
}

namespace {

// Set while AllocatorReuseCheck calls malloc through a pointer: the slow path
// counts the calls that reach it.
thread_local bool t_probing LAZYPIN_TLS = false;
thread_local int t_probe_hits LAZYPIN_TLS = 0;

// Whether a call through `fn` reaches lazypin's malloc. Every malloc takes
// the slow path meanwhile (the parked count is raised; nothing is parked, so
// nothing is served).
bool ReachesOurMalloc(void* fn) {
  g_alloc_gauge.fetch_add(1, std::memory_order_relaxed);
  t_probing = true;
  t_probe_hits = 0;
  void* p = reinterpret_cast<MallocFn>(fn)(24);
  t_probing = false;
  g_alloc_gauge.fetch_sub(1, std::memory_order_relaxed);
  const bool reached = t_probe_hits > 0;
  free(p);
  return reached;
}

}  // namespace

bool AllocatorReuseCheck(std::string* why) {
  real::DlsymFn dlsym_real = real::Dlsym();
  Dl_info self;
  if (dlsym_real == nullptr ||
      dladdr(reinterpret_cast<void*>(&AllocatorReuseCheck), &self) == 0) {
    *why = "dlsym or dladdr failed";
    return false;
  }
  // A non-PIE executable that takes malloc's address gets the symbol's
  // canonical address: its own PLT entry (an undefined symbol with a value),
  // which calls whatever the lookup found. Then a call through it tells.
  void* probe_through = nullptr;
  for (const char* name : {"malloc", "calloc", "realloc", "free", "posix_memalign",
                           "aligned_alloc", "memalign", "valloc", "pvalloc"}) {
    Dl_info info;
    void* sym_entry = nullptr;
    void* global = dlsym_real(RTLD_DEFAULT, name);
    const bool found = global != nullptr && dladdr1(global, &info, &sym_entry, RTLD_DL_SYMENT) != 0;
    const auto* sym = static_cast<const ElfW(Sym)*>(sym_entry);
    const bool plt_entry = found && info.dli_fbase != self.dli_fbase && sym != nullptr &&
                           sym->st_shndx == SHN_UNDEF;
    if (plt_entry) {
      if (strcmp(name, "malloc") == 0) probe_through = global;
    } else if (!found || info.dli_fbase != self.dli_fbase) {
      *why = std::string("the process's ") + name + " is " +
             (found && info.dli_fname ? info.dli_fname : "?") + "'s, not lazypin's";
      return false;
    }
    void* next = dlsym_real(RTLD_NEXT, name);
    if (next == nullptr || dladdr(next, &info) == 0 || info.dli_fname == nullptr ||
        strstr(info.dli_fname, "libc.so") == nullptr) {
      *why = std::string("the next ") + name + " is " +
             (next != nullptr && info.dli_fname != nullptr ? info.dli_fname : "?") +
             "'s, not glibc's";
      return false;
    }
  }
  if (probe_through != nullptr && !ReachesOurMalloc(probe_through)) {
    *why = "a call through the executable's malloc does not reach lazypin's";
    return false;
  }
  return true;
}

}  // namespace lazypin

using namespace lazypin;  // NOLINT: the hooks below are C symbols

// Each hook: the fast path (nothing parked and the real function known: one
// relaxed load, then a tail call through the real function), else its slow
// path out of line: a parked block, the lookup, or the arena.

__attribute__((noinline)) static void* MallocSlow(size_t bytes) {
  if (t_probing) ++t_probe_hits;
  if (Parked()) {
    if (void* block = ServeParked(bytes, 0, false)) return block;
  }
  MaybeAnnounce(bytes);
  if (MallocFn real = RealOrNull(g_malloc, "malloc")) {
    const int saved_errno = errno;
    void* p = CallAllocator(real, bytes);
    if (p == nullptr && RetryAfterRelease(saved_errno, bytes)) p = CallAllocator(real, bytes);
    return p;
  }
  void* p = BootstrapAlloc(bytes, 0);
  if (p == nullptr) errno = ENOMEM;
  return p;
}

LAZYPIN_EXPORT void* malloc(size_t bytes) {
  if (__builtin_expect(!AnyParked(), 1)) {
    if (MallocFn real = g_malloc.Peek()) return CallAllocator(real, bytes);
  }
  return MallocSlow(bytes);
}

__attribute__((noinline)) static void* CallocSlow(size_t count, size_t size) {
  size_t bytes;
  if (__builtin_mul_overflow(count, size, &bytes)) bytes = ~size_t{0};
  if (Parked() && bytes != ~size_t{0}) {
    if (void* block = ServeParked(bytes, 0, true)) return block;
  }
  MaybeAnnounce(bytes);
  if (CallocFn real = RealOrNull(g_calloc, "calloc")) {
    const int saved_errno = errno;
    void* p = CallAllocator(real, count, size);
    if (p == nullptr && bytes != ~size_t{0} && RetryAfterRelease(saved_errno, bytes)) p = CallAllocator(real, count, size);
    return p;
  }
  void* p = bytes == ~size_t{0} ? nullptr : BootstrapAlloc(bytes, 0);  // the arena is zero
  if (p == nullptr) errno = ENOMEM;
  return p;
}

LAZYPIN_EXPORT void* calloc(size_t count, size_t size) {
  if (__builtin_expect(!AnyParked(), 1)) {
    if (CallocFn real = g_calloc.Peek()) return CallAllocator(real, count, size);
  }
  return CallocSlow(count, size);
}

__attribute__((noinline)) static int PosixMemalignSlow(void** out, size_t align, size_t bytes) {
  if (Parked() && PowerOfTwo(align) && align % sizeof(void*) == 0) {
    if (void* block = ServeParked(bytes, align, false)) {
      *out = block;
      return 0;
    }
  }
  MaybeAnnounce(bytes);
  if (PosixMemalignFn real = RealOrNull(g_posix_memalign, "posix_memalign")) {
    int rc = CallAllocator(real, out, align, bytes);
    if (rc == ENOMEM && RetryAfterRelease(errno, bytes)) rc = CallAllocator(real, out, align, bytes);
    return rc;
  }
  void* p = BootstrapAlloc(bytes, align);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}

LAZYPIN_EXPORT int posix_memalign(void** out, size_t align, size_t bytes) {
  if (__builtin_expect(!AnyParked(), 1)) {
    if (PosixMemalignFn real = g_posix_memalign.Peek()) return CallAllocator(real, out, align, bytes);
  }
  return PosixMemalignSlow(out, align, bytes);
}

// memalign and aligned_alloc (glibc: the same function), valloc and pvalloc
// (an alignment of a page; pvalloc rounds the request up to whole pages).
__attribute__((noinline)) static void* AlignedSlow(real::Lazy<AlignFn>& lazy, const char* name,
                                                   size_t align, size_t bytes) {
  if (Parked() && PowerOfTwo(align)) {
    if (void* block = ServeParked(bytes, align, false)) return block;
  }
  MaybeAnnounce(bytes);
  if (AlignFn real = RealOrNull(lazy, name)) {
    const int saved_errno = errno;
    void* p = CallAllocator(real, align, bytes);
    if (p == nullptr && errno == ENOMEM && RetryAfterRelease(saved_errno, bytes)) p = CallAllocator(real, align, bytes);
    return p;
  }
  void* p = BootstrapAlloc(bytes, align);
  if (p == nullptr) errno = ENOMEM;
  return p;
}

LAZYPIN_EXPORT void* aligned_alloc(size_t align, size_t bytes) {
  if (__builtin_expect(!AnyParked(), 1)) {
    if (AlignFn real = g_aligned_alloc.Peek()) return CallAllocator(real, align, bytes);
  }
  return AlignedSlow(g_aligned_alloc, "aligned_alloc", align, bytes);
}

LAZYPIN_EXPORT void* memalign(size_t align, size_t bytes) {
  if (__builtin_expect(!AnyParked(), 1)) {
    if (AlignFn real = g_memalign.Peek()) return CallAllocator(real, align, bytes);
  }
  return AlignedSlow(g_memalign, "memalign", align, bytes);
}

__attribute__((noinline)) static void* PageAlignedSlow(real::Lazy<MallocFn>& lazy, const char* name,
                                                       size_t bytes, size_t serve_bytes) {
  const size_t page = PageSize();
  if (Parked() && serve_bytes != 0) {
    if (void* block = ServeParked(serve_bytes, page, false)) return block;
  }
  MaybeAnnounce(bytes);
  if (MallocFn real = RealOrNull(lazy, name)) {
    const int saved_errno = errno;
    void* p = CallAllocator(real, bytes);
    if (p == nullptr && RetryAfterRelease(saved_errno, bytes)) p = CallAllocator(real, bytes);
    return p;
  }
  void* p = BootstrapAlloc(serve_bytes != 0 ? serve_bytes : bytes, page);
  if (p == nullptr) errno = ENOMEM;
  return p;
}

LAZYPIN_EXPORT void* valloc(size_t bytes) {
  if (__builtin_expect(!AnyParked(), 1)) {
    if (MallocFn real = g_valloc.Peek()) return CallAllocator(real, bytes);
  }
  return PageAlignedSlow(g_valloc, "valloc", bytes, bytes);
}

LAZYPIN_EXPORT void* pvalloc(size_t bytes) {
  if (__builtin_expect(!AnyParked(), 1)) {
    if (MallocFn real = g_pvalloc.Peek()) return CallAllocator(real, bytes);
  }
  const size_t page = PageSize();
  const size_t rounded = bytes <= ~size_t{0} - page ? (bytes + page - 1) & ~(page - 1) : 0;
  return PageAlignedSlow(g_pvalloc, "pvalloc", bytes, rounded);
}

// glibc's figures, with the blocks lazypin parked counted as freed (they
// are, to the program).
LAZYPIN_EXPORT struct mallinfo2 mallinfo2() {
  using Mallinfo2Fn = struct mallinfo2 (*)();
  static real::Lazy<Mallinfo2Fn> real_mallinfo2;
  Mallinfo2Fn real = real_mallinfo2.Get(&real::Next, "mallinfo2");
  struct mallinfo2 info = real != nullptr ? real() : (struct mallinfo2){};
  if (Parked()) {
    if (const MemoryGuard* guard = PublishedGuard()) {
      guard->HideParked(&info.uordblks, &info.fordblks, &info.hblks, &info.hblkhd);
    }
  }
  return info;
}

LAZYPIN_EXPORT struct mallinfo mallinfo() {
  const struct mallinfo2 wide = mallinfo2();
  struct mallinfo info = {};  // glibc's own narrowing: each field cut to int
  info.arena = static_cast<int>(wide.arena);
  info.ordblks = static_cast<int>(wide.ordblks);
  info.smblks = static_cast<int>(wide.smblks);
  info.hblks = static_cast<int>(wide.hblks);
  info.hblkhd = static_cast<int>(wide.hblkhd);
  info.usmblks = static_cast<int>(wide.usmblks);
  info.fsmblks = static_cast<int>(wide.fsmblks);
  info.uordblks = static_cast<int>(wide.uordblks);
  info.fordblks = static_cast<int>(wide.fordblks);
  info.keepcost = static_cast<int>(wide.keepcost);
  return info;
}

// Followed so that a parked block is served only where glibc could have made
// that block fresh (GlibcMmapFloorNow); the call itself is glibc's.
LAZYPIN_EXPORT int mallopt(int param, int value) {
  MalloptFn real = g_mallopt.Get(&real::Next, "mallopt");
  if (real == nullptr) return 0;
  const int ok = real(param, value);
  if (ok != 0) GlibcNoteMallopt(param, value);
  if (ok != 0 && (param == M_MMAP_THRESHOLD || param == M_MMAP_MAX)) {
    // Parked mmapped blocks may no longer be what a fresh block of their size
    // would be: all are released (the program's frees reach glibc), as bare
    // they had been.
    if (AnyParked()) ReleaseParked();
  }
  return ok;
}

// glibc's own reports of its state: parked blocks are freed first (the
// program's frees reach glibc), so that they print what they would bare.
LAZYPIN_EXPORT void malloc_stats() {
  using MallocStatsFn = void (*)();
  static real::Lazy<MallocStatsFn> real_malloc_stats;
  ReleaseParked();
  if (MallocStatsFn real = real_malloc_stats.Get(&real::Next, "malloc_stats")) real();
}

LAZYPIN_EXPORT int malloc_info(int options, FILE* stream) {
  using MallocInfoFn = int (*)(int, FILE*);
  static real::Lazy<MallocInfoFn> real_malloc_info;
  ReleaseParked();
  MallocInfoFn real = real_malloc_info.Get(&real::Next, "malloc_info");
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  return real(options, stream);
}
