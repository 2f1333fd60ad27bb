// prefault: large first registers faulted in by a few threads (see prefault.h).
#include "prefault.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>

#include "page_class.h"
#include "pages.h"
#include "seccomp.h"
#include "thread_state.h"

namespace lazypin {
namespace {

constexpr unsigned kIoMemory = 0x04;  // CU_MEMHOSTREGISTER_IOMEMORY
constexpr unsigned kReadOnly = 0x08;  // CU_MEMHOSTREGISTER_READ_ONLY
constexpr unsigned kKnownFlags = 0x0f;  // PORTABLE, DEVICEMAP, IOMEMORY, READ_ONLY
constexpr uintptr_t kHugePage = uintptr_t{2} << 20;  // chunks end on huge-page boundaries
constexpr int kMaxThreads = 16;
constexpr int kMpolDefault = 0, kMpolPreferred = 1;
std::atomic<bool> g_unsupported{false};

bool Populate(uintptr_t lo, uintptr_t hi) {
  if (lo >= hi) return true;
  if (PopulateWrite(reinterpret_cast<void*>(lo), hi - lo)) return true;
  if (errno == EINVAL) g_unsupported.store(true, std::memory_order_relaxed);
  return false;
}

struct Chunk {
  uintptr_t lo, hi;
  int node;  // the NUMA node to prefer (the caller's), or -1: the thread's own policy
  bool ok;
};

void* PopulateChunk(void* arg) {
  auto* c = static_cast<Chunk*>(arg);
  ScopedInsideLazypin inside;
  if (c->node >= 0) {
    // Where the caller's own faults would have put the pages (first touch).
    unsigned long mask[16] = {};
    mask[c->node / 64] = 1ul << (c->node % 64);
    syscall(SYS_set_mempolicy, kMpolPreferred, mask, sizeof(mask) * 8);
  }
  c->ok = Populate(c->lo, c->hi);
  return nullptr;
}

// The caller's NUMA node when its memory policy is the default (first touch), else -1.
int CallerNode() {
  int mode = -1;
  if (syscall(SYS_get_mempolicy, &mode, nullptr, 0, nullptr, 0) != 0 || mode != kMpolDefault) {
    return -1;
  }
  unsigned cpu = 0, node = 0;
  if (getcpu(&cpu, &node) != 0 || node >= 16 * 64) return -1;
  return static_cast<int>(node);
}

// Whether every page of [lo, hi) is private anonymous memory mapped readable
// and writable, as a writable register needs it: a range the driver would
// refuse (a PROT_NONE or read-only page, a hole) gets nothing faulted in.
bool PrefaultableRange(uintptr_t lo, uintptr_t hi) {
  lo = PageFloor(lo);
  hi = PageCeil(hi);
  uintptr_t cursor = lo;
  bool ok = true;
  const bool read = ForEachMapping(lo, hi, [&](const Mapping& m) {
    if (m.lo > cursor || m.shared || m.has_file || !m.readable || !m.writable) {
      ok = false;
      return false;
    }
    cursor = m.hi;
    return cursor < hi;
  });
  return read && ok && cursor >= hi;
}

}  // namespace

bool ShouldPrefault(uintptr_t lo, uintptr_t hi, unsigned flags, int threads) {
  if (threads <= 1 || hi - lo < kPrefaultMinBytes || (flags & ~kKnownFlags) != 0 ||
      (flags & (kReadOnly | kIoMemory)) != 0 || g_unsupported.load(std::memory_order_relaxed)) {
    return false;
  }
  if (SeccompFiltered()) {  // set_mempolicy, get_mempolicy, MADV_POPULATE_WRITE may be forbidden
    if (TakeSeccompNotice()) {
      fprintf(stderr, "lazypin: a seccomp filter is in force (%s); LAZYPIN_PREFAULT is off from "
              "now on (its system calls may be forbidden)\n", SeccompStatusText().c_str());
    }
    return false;
  }
  return PrefaultableRange(lo, hi);
}

constexpr size_t kHelperStack = size_t{64} << 10;

int PrefaultRange(uintptr_t lo, uintptr_t hi, int threads) {
  lo = PageFloor(lo);
  hi = PageCeil(hi);
  if (threads < 1 || lo >= hi || g_unsupported.load(std::memory_order_relaxed)) return 0;
  if (threads > kMaxThreads) threads = kMaxThreads;
  const uintptr_t per = (hi - lo) / threads;
  Chunk chunks[kMaxThreads];
  int n = 0;
  for (uintptr_t at = lo; at < hi && n < threads; ++n) {
    uintptr_t end = n == threads - 1 ? hi : (at + per + kHugePage - 1) & ~(kHugePage - 1);
    if (end > hi || end <= at) end = hi;
    chunks[n] = Chunk{at, end, -1, false};
    at = end;
  }
  const int node = CallerNode();
  // Helpers run with every signal blocked (the program's handlers are not
  // theirs); a helper that cannot be started leaves its chunk to the caller.
  pthread_t helpers[kMaxThreads];
  bool started[kMaxThreads] = {};
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  // A small stack (a helper only touches pages): glibc keeps the stacks of
  // joined threads mapped for reuse, address space the program's RLIMIT_AS counts.
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, kHelperStack);
  for (int i = 1; i < n; ++i) {
    chunks[i].node = node;
    started[i] = pthread_create(&helpers[i], &attr, &PopulateChunk, &chunks[i]) == 0;
  }
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  chunks[0].ok = Populate(chunks[0].lo, chunks[0].hi);
  int ok = chunks[0].ok ? 1 : 0;
  for (int i = 1; i < n; ++i) {
    if (started[i]) {
      pthread_join(helpers[i], nullptr);
    } else {
      chunks[i].ok = Populate(chunks[i].lo, chunks[i].hi);
    }
    ok += chunks[i].ok ? 1 : 0;
  }
  return ok;
}

}  // namespace lazypin
