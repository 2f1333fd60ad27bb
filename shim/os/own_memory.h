// own_memory: lazypin reading the program's memory, and scratch of its own,
// without a fault and without the memory hooks.
#pragma once

#include <cstddef>

namespace lazypin {

// Copies `n` bytes of this process's memory at `src` to `dst`
// (process_vm_readv on itself): false where any byte of `src` could not be
// read (unmapped, protected, or the system call refused), never a fault.
// Also false, without the call, where a seccomp filter may be in force (the
// call is one a CUDA program need not make: seccomp.h). `dst` must be
// lazypin's own writable memory.
bool ReadOwnMemory(void* dst, const void* src, size_t n);

// Private anonymous memory of `n` bytes for lazypin's own use, by the raw
// system calls: no hook sees it, and the pool never holds it. Null on failure.
void* MapScratch(size_t n);
void UnmapScratch(void* p, size_t n);

}  // namespace lazypin
