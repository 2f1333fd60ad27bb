// hooks_alloc: the allocation hooks (malloc, calloc, posix_memalign,
// aligned_alloc, memalign, valloc, pvalloc; realloc(NULL, n) in
// hooks_memory.cc) that hand parked blocks back (LAZYPIN_REUSE_FREED, see
// Pool::Park) and, while lazypin keeps memory the program gave back, let it
// yield before a large allocation (memory_budget.h). With nothing parked or
// kept each is one relaxed load and the next definition (glibc's, or a
// preloaded allocator's).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "fork_fence.h"
#include "thread_state.h"

namespace lazypin {

// The allocation hooks' one word: blocks parked in this process (the pool's
// ReuseHooks::gauge, low 32 bits) plus MemoryBudget::kKeptUnit per pinned
// host block kept (host_alloc_cache.h). Zero: every hook is its fast path.
extern std::atomic<int64_t> g_alloc_gauge;

// The program is about to allocate `bytes` while lazypin keeps memory it gave
// back: kept memory yields first where the headroom is short
// (MemoryGuard::MakeRoomFor). For sizes of MemoryBudget::kAnnounceMin and more.
void AnnounceAllocation(size_t bytes);

// The program's allocation of `bytes` failed while lazypin keeps memory:
// everything kept is released (MemoryGuard::ReleaseKept) and
// true says to try once more, with errno put back to `saved_errno` (so that
// a retry that succeeds leaves errno as a first success would have).
bool RetryAfterRelease(int saved_errno, size_t bytes);

// True if freed blocks may come back here: the process's malloc family is
// lazypin's hooks and the next definitions are glibc's (another allocator,
// preloaded before or after lazypin, has other block sizes and layouts:
// the feature steps aside). False with the reason otherwise.
bool AllocatorReuseCheck(std::string* why);

// A parked block for an allocation (null if none): through the published
// guard. Zeroed (the whole usable size) for `zero` (calloc's, as glibc's
// calloc clears its chunk) and when it is an mmapped chunk (a fresh one is
// new pages, which read as zeros).
void* ServeParked(size_t bytes, size_t align, bool zero);


// fn(args...): a real allocator call. On one of lazypin's own threads it
// passes the fork fence (fork_fence.h); on the program's, a tail call.
template <typename Fn, typename... Args>
__attribute__((noinline)) auto CallAllocatorInPass(Fn fn, Args... args) {
  ForkFence::Pass pass;
  return fn(args...);
}
template <typename Fn, typename... Args>
inline auto CallAllocator(Fn fn, Args... args) {
  if (__builtin_expect(t_own_thread, 0)) return CallAllocatorInPass(fn, args...);
  return fn(args...);
}

// Memory handed out while lazypin looked a real function up (the loader may
// allocate meanwhile): a static arena, never given to the real free.
bool InBootstrapArena(const void* ptr);
void* BootstrapAlloc(size_t bytes, size_t align);
size_t BootstrapSize(const void* ptr);

}  // namespace lazypin
