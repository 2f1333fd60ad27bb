// hooks_alloc: the allocation hooks (malloc, calloc, posix_memalign,
// aligned_alloc, memalign, valloc, pvalloc; realloc(NULL, n) in
// hooks_memory.cc) that hand parked blocks back (LAZYPIN_REUSE_FREED, see
// Pool::Park). With nothing parked each is one relaxed load and the next
// definition (glibc's, or a preloaded allocator's).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace lazypin {

// Blocks parked in this process (the pool's ReuseHooks::gauge).
extern std::atomic<int64_t> g_parked_blocks;

// True if freed blocks may come back here: the process's malloc family is
// lazypin's hooks and the next definitions are glibc's (another allocator,
// preloaded before or after lazypin, has other block sizes and layouts:
// the feature steps aside). False with the reason otherwise.
bool AllocatorReuseCheck(std::string* why);

// A parked block for an allocation (null if none): through the published
// guard. `zero`: calloc's (the whole usable size is zeroed, as glibc's
// calloc clears its chunk).
void* ServeParked(size_t bytes, size_t align, bool zero);

// Memory handed out while lazypin looked a real function up (the loader may
// allocate meanwhile): a static arena, never given to the real free.
bool InBootstrapArena(const void* ptr);
void* BootstrapAlloc(size_t bytes, size_t align);
size_t BootstrapSize(const void* ptr);

}  // namespace lazypin
