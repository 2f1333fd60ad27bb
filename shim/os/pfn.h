// pfn: the physical page frames behind a virtual range, from /proc/self/pagemap
// (readable with CAP_SYS_ADMIN; without it the kernel reports zeros). Used by
// LAZYPIN_CHECK_PFN to prove that a pooled registration still covers the
// pages the program now has at that address (UCX's RCACHE_CHECK_PFN).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lazypin {

// One entry per page of [ptr, ptr+bytes): the frame number, or 0 if the page
// is not present. False when pagemap cannot be read or hides frame numbers.
bool ReadPageFrames(uintptr_t ptr, size_t bytes, std::vector<uint64_t>* frames);

}  // namespace lazypin
