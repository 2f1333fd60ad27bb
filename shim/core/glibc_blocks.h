// glibc_blocks: the malloc_usable_size a fresh block from glibc's malloc
// (x86_64/aarch64 LP64 layout: 8-byte size fields, 16-byte alignment) can
// have for a request, so that a parked block is handed only to a request
// whose own fresh block could have looked exactly like it. Pure arithmetic;
// tests/unit/reuse_test.cc checks it against the glibc it runs on.
#pragma once

#include <cstddef>

namespace lazypin {

// Every malloc_usable_size a fresh glibc block of `bytes` with alignment
// `align` (0 or <= 16: malloc, calloc, realloc(NULL, n)) may have:
//  - from the heap, the chunk request2size(bytes) or one 16 bytes larger (a
//    bin's chunk whose remainder is below the minimum chunk), usable 8 less;
//    with a larger alignment also one 32 bytes larger (memalign keeps a tail
//    below the minimum chunk after it splits off the aligned part);
//  - mmapped (chunks of 128 KiB and more, glibc's lowest mmap threshold):
//    the page-rounded mapping less the chunk header, and for an alignment up
//    to a page, less the lead memalign skips.
struct FreshSizes {
  static constexpr int kMax = 4;
  size_t usable[kMax];
  int count = 0;
};
FreshSizes GlibcFreshUsable(size_t bytes, size_t align, size_t page);

}  // namespace lazypin
