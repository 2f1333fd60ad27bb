// prefault: a first register of a large range, faster. The driver faults in
// the pages it pins on the calling thread, one by one; faulting them in first
// with a few threads (madvise(MADV_POPULATE_WRITE) on one chunk each, Linux
// 5.14+) and then registering measured 2.3-2.7x faster on the H200 for fresh
// 64 MiB-4 GiB with 4 threads (8 and 16 were slower: docs/benchmarks.md).
//
// Contents never change: POPULATE_WRITE only faults in what a write would
// (zeroed pages where none were, a private copy of a shared one), which the
// driver's own writable pin does too. So it is only done where the register
// would do the same: private anonymous memory (page_class.h) whose every page
// is mapped readable and writable (a range with a PROT_NONE or read-only page,
// which the driver refuses, gets nothing faulted in), registered writable
// (neither READ_ONLY nor IOMEMORY, no unknown flag), with a context current,
// and never under a seccomp filter (seccomp.h: set_mempolicy, get_mempolicy
// and MADV_POPULATE_WRITE are calls the program may not be allowed). Errors
// are ignored: the register then faults in the rest itself, and answers as
// it would have. The helpers prefer the caller's NUMA node
// (where its own first touch would have put the pages) when the caller's
// memory policy is the default; a helper that cannot be started (a thread
// limit) leaves its chunk to the calling thread.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lazypin {

// Registers smaller than this are left to the driver.
constexpr size_t kPrefaultMinBytes = size_t{64} << 20;

// Faults [lo, hi) in with `threads` threads (the calling one included);
// returns how many chunks were populated without error (0: none, or the
// kernel lacks MADV_POPULATE_WRITE, which is then not tried again).
int PrefaultRange(uintptr_t lo, uintptr_t hi, int threads);

// Whether a register of [lo, hi) with `flags` (CU_MEMHOSTREGISTER_*) gets
// faulted in first with `threads` threads (LAZYPIN_PREFAULT): large enough,
// writable, every page private anonymous and mapped readable and writable.
bool ShouldPrefault(uintptr_t lo, uintptr_t hi, unsigned flags, int threads);

}  // namespace lazypin
