// unwind: the calling thread's return addresses, never faulting, whatever the
// stack holds (coroutines, fibers made with makecontext, green threads, JITs,
// hand-written assembly, a bogus outermost return address).
//
// On x86-64 the walk is lazypin's own, by the DWARF call-frame information of
// the loaded objects (.eh_frame through .eh_frame_hdr, found with the loader's
// _dl_find_object: no lock, no allocation), and it reads nothing it has not
// checked first:
//  - code: a frame's return address is looked up, never read, and only in an
//    object the loader mapped; an address in no object (or with no unwind
//    entry) ends the walk (libgcc's unwinder reads the code at such an address,
//    looking for a signal trampoline, and faults when nothing is mapped there);
//  - the stack: every read of a saved register or the return address lies
//    between the stack pointer at the call and the end of the mapping that
//    holds it, which must be readable (one PROCMAP_QUERY, or the text of
//    /proc/self/maps on kernels before 6.11); a frame whose CFA leaves that
//    range, or does not move up the stack, ends the walk.
// Elsewhere, libgcc's _Unwind_Backtrace (not checked that way).
#pragma once

#include <cstddef>
#include <cstdint>

namespace lazypin {

// The return addresses of the calling thread's stack, innermost first (the
// caller of this function first), without those inside [skip_lo, skip_hi); at
// most `capacity`. Returns how many.
size_t SafeBacktrace(uintptr_t* frames, size_t capacity, uintptr_t skip_lo, uintptr_t skip_hi);

}  // namespace lazypin
