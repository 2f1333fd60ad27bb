// prefault: a first register of a large range at memory speed. The driver
// faults in the pages it pins on the calling thread, one by one, through the
// kernel's get_user_pages; faulting them in first with the cores the program
// may use and then registering is 3-6x faster for fresh memory on the H200
// (docs/benchmarks.md, "Big first pins").
//
// How: each thread writes one byte per page of its own contiguous slice (huge
// pages: one per 2 MiB block where the block got one) with an atomic
// fetch-or of 0, a write fault that changes no byte even while other threads
// write the same memory. That is the limit a program gets by touching its
// memory itself, and it scales with threads where MADV_POPULATE_WRITE does
// not (that runs through get_user_pages under the mmap lock: 2-5x slower per
// page, and slower with 16 threads than with 4, on the H200).
//
// Contents never change, and only what the driver's own writable pin would
// fault in is faulted in (zeroed pages where none were, a private copy of a
// shared one). So it is only done where the register would do the same:
// private anonymous memory (page_class.h) whose every page is mapped readable
// and writable, registered writable (neither READ_ONLY nor IOMEMORY, no
// unknown flag), with a context current, and never under a seccomp filter.
// Before any helper writes, the calling thread faults in the first page of
// every mapping of the range with MADV_POPULATE_WRITE, which checks the
// caller's own rights (memory protection keys too): a mapping it may not
// write (where the driver fails) gets nothing more, and no helper ever takes
// a fault the program's own thread would not. Where the kernel lacks
// MADV_POPULATE_WRITE (before Linux 5.14) the helpers touch only on a CPU
// without protection keys. One difference is left: a program that unmaps or
// write-protects the range on another thread while this thread registers it
// (a race of its own) can have a helper take the SIGSEGV where the driver's
// pin would have failed with an error.
//
// Threads: at most LAZYPIN_PREFAULT, at most the CPUs of the calling
// thread's affinity mask (sched_getaffinity), one slice of at least 16 MiB
// each. With several NUMA nodes, where the caller's memory policy is the
// default, the pages go where its own first touch would have put them: the
// helpers run on the CPUs of the caller's node (its CPUs in the mask) and
// prefer that node. Helpers run with every signal blocked, small stacks, and
// the caller's protection-key rights; one that cannot be started leaves its
// slice to the caller.
//
// Huge pages: where the program's mapping gets them (transparent huge pages
// "always", or a range it madvised), a helper writes one byte per 2 MiB block
// and the rest of a block only where the kernel gave it small pages (mincore
// of the block's last page). LAZYPIN_PREFAULT_HUGE=1 asks for them
// (MADV_HUGEPAGE on the range's whole 2 MiB blocks) on ranges lazypin
// prefaults, unless the program said no (MADV_NOHUGEPAGE, PR_SET_THP_DISABLE:
// read from /proc/self/smaps, only then) or the kernel's mode is "never"; the
// program's own setting is never changed unasked.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "seccomp.h"

namespace lazypin {

// Faults [p, p + bytes) in for writing, contents unchanged, safe while other
// threads use the memory (MADV_POPULATE_WRITE); false where the kernel lacks
// it (before Linux 5.14) or a page cannot be had, and not tried once a
// seccomp filter was seen (seccomp.h).
inline bool PopulateWrite(void* p, size_t bytes) {
  return !SeccompFilterSeen() && madvise(p, bytes, 23) == 0;
}

// Registers smaller than this are left to the driver.
constexpr size_t kPrefaultMinBytes = size_t{64} << 20;
// A helper's slice is at least this big (thread start-up against its work).
constexpr size_t kPrefaultMinSlice = size_t{16} << 20;
// The most threads one prefault uses (LAZYPIN_PREFAULT's bound).
constexpr int kPrefaultMaxThreads = 64;
constexpr uintptr_t kHugeBytes = uintptr_t{2} << 20;

struct PrefaultOptions {
  int threads = 0;     // LAZYPIN_PREFAULT: the most threads; 0 or 1: none
  bool huge = false;   // LAZYPIN_PREFAULT_HUGE: ask for huge pages
};

// What the planner knows of the machine and the calling thread.
struct PrefaultMachine {
  std::vector<int> cpus;   // the calling thread's affinity mask, ascending
  std::vector<int> nodes;  // the NUMA node of each of cpus (same index), -1 unknown
  int caller_node = -1;    // the caller's node where its memory policy is the default, else -1
};

struct PrefaultSlice {
  uintptr_t lo, hi;
};

struct PrefaultPlan {
  // One per thread, contiguous, in address order, each ending on a 2 MiB
  // boundary (but the last); slice 0 is the calling thread's. Empty: none.
  std::vector<PrefaultSlice> slices;
  std::vector<int> helper_cpus;  // where helpers run; empty: the caller's mask
  int prefer_node = -1;          // MPOL_PREFERRED for the helpers, -1: their inherited policy
};

// The plan for [lo, hi) (page-aligned) with at most `max_threads` threads.
PrefaultPlan PlanPrefault(uintptr_t lo, uintptr_t hi, int max_threads, const PrefaultMachine& m);

// The calling thread's machine: its affinity mask, the nodes of those CPUs
// (/sys/devices/system/node, read once), its node where its policy is the default.
PrefaultMachine ReadPrefaultMachine();

enum class ThpMode { kNever, kMadvise, kAlways, kUnknown };
// /sys/kernel/mm/transparent_hugepage/enabled, read once.
ThpMode ReadThpMode();
ThpMode ParseThpMode(const char* text);

// What one PrefaultRange did.
struct PrefaultResult {
  int threads = 0;       // threads that faulted pages in (0: none)
  int slices_ok = 0;     // slices done
  bool huge = false;     // the range's first whole block got a huge page
  bool advised = false;  // MADV_HUGEPAGE was asked (LAZYPIN_PREFAULT_HUGE)
  bool touched = false;  // false: nothing was faulted in by lazypin (refused, or none to do)
};

// Faults [lo, hi) in as above; errors are ignored (the register then faults
// in the rest itself, and answers as it would have).
PrefaultResult PrefaultRange(uintptr_t lo, uintptr_t hi, const PrefaultOptions& options);
// Today's callers: threads alone.
inline int PrefaultRange(uintptr_t lo, uintptr_t hi, int threads) {
  return PrefaultRange(lo, hi, PrefaultOptions{threads, false}).slices_ok;
}

// Whether a register of [lo, hi) with `flags` (CU_MEMHOSTREGISTER_*) gets
// faulted in first with `threads` threads (LAZYPIN_PREFAULT): large enough,
// writable, every page private anonymous and mapped readable and writable.
bool ShouldPrefault(uintptr_t lo, uintptr_t hi, unsigned flags, int threads);

// Whether the kernel enabled memory protection keys on this CPU (OSPKE).
bool CpuHasProtectionKeys();
// Tests: act as on a kernel without MADV_POPULATE_WRITE (true), or as found.
void PrefaultAssumeNoPopulateForTest(bool none);

// Whether the mappings overlapping [lo, hi) say no to huge pages
// (VmFlags "nh" in /proc/self/smaps), or the process does (PR_GET_THP_DISABLE).
bool HugePagesRefused(uintptr_t lo, uintptr_t hi);

}  // namespace lazypin
