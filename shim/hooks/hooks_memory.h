// hooks_memory: the exported memory hooks (free, realloc, munmap, mremap,
// mmap(MAP_FIXED), madvise, brk/sbrk, shmdt, shmat) that invalidate pooled
// registrations before memory leaves the process, and their self-test; those
// that free a kept host block first (mprotect, mincore, mlock, mlock2,
// munlock, msync, mmap(MAP_FIXED_NOREPLACE)); and ioctl, for the program's
// own UFFDIO_REGISTER (lazypin's watch lets go of the range first).
#pragma once

#include <string>

namespace lazypin {

// Proves that the process's global free/realloc/munmap/mremap/mmap/madvise
// resolve to lazypin's hooks and that a call through them reaches the hook
// (as UCX checks its memory hooks at start). False with a reason otherwise.
bool MemoryHooksSelfTest(std::string* why);

// The next free() after lazypin's (glibc's, or a preloaded allocator's).
void RealFree(void* ptr);

}  // namespace lazypin
