// glibc_blocks: the malloc_usable_size a fresh block from glibc's malloc
// (x86_64/aarch64 LP64 layout: 8-byte size fields, 16-byte alignment) can
// have for a request, so that a parked block is handed only to a request
// whose own fresh block could have looked exactly like it. Pure arithmetic;
// tests/unit/core/reuse_test.cc checks it against the glibc it runs on.
#pragma once

#include <cstddef>

namespace lazypin {

// Every malloc_usable_size a fresh glibc block of `bytes` with alignment
// `align` (0 or <= 16: malloc, calloc, realloc(NULL, n)) may have:
//  - from the heap, the chunk request2size(bytes) or one 16 bytes larger (a
//    bin's chunk whose remainder is below the minimum chunk), usable 8 less;
//    with a larger alignment also one 32 bytes larger (memalign keeps a tail
//    below the minimum chunk after it splits off the aligned part);
//  - mmapped (chunks of `mmap_floor` and more: glibc's lowest dynamic mmap
//    threshold, 128 KiB, or the one mallopt set; kGlibcNoMmap: none):
//    the page-rounded mapping less the chunk header, and for an alignment up
//    to a page, less the lead memalign skips.
struct FreshSizes {
  static constexpr int kMax = 4;
  size_t usable[kMax];
  int count = 0;
};
constexpr size_t kGlibcMmapFloor = size_t{128} << 10;  // DEFAULT_MMAP_THRESHOLD_MIN
constexpr size_t kGlibcNoMmap = ~size_t{0};            // mallopt(M_MMAP_MAX, 0)
FreshSizes GlibcFreshUsable(size_t bytes, size_t align, size_t page,
                            size_t mmap_floor = kGlibcMmapFloor);

// glibc's mmap threshold as far as lazypin knows it: what the program set
// with mallopt (the mallopt hook calls GlibcNoteMallopt after glibc accepted
// it; a threshold set through the environment at start is not seen).
void GlibcNoteMallopt(int param, int value);
// The smallest request glibc may serve with an mmapped chunk now (for
// GlibcFreshUsable, and the smallest mmapped chunk worth parking: a fresh
// block of its size would be mmapped again): its lowest dynamic threshold,
// or the one mallopt set; kGlibcNoMmap after M_MMAP_MAX 0. glibc's dynamic
// threshold, which the free of an mmapped chunk of up to 32 MiB raises to
// its size, never meets a parked block: such a chunk is not parked
// (GlibcFreeMovesThreshold).
size_t GlibcMmapFloorNow();

// Whether glibc's free of an mmapped chunk of `chunk_bytes` may raise its
// dynamic mmap threshold (to the chunk's size, where it is at most 32 MiB;
// not once mallopt or a tunable fixed the threshold): then later allocations
// of that size come from the heap, and such a chunk is never kept back from
// glibc's free (nor could a fresh block of its size be mmapped again).
bool GlibcFreeMovesThreshold(size_t chunk_bytes);

// glibc's free of an mmapped chunk that lazypin releases later (its
// unregister first), as glibc's state goes, made now: a stand-in mapping of
// the chunk's size holding its header words, which glibc's free takes as the
// chunk (threshold raised as GlibcFreeMovesThreshold says, mmapped count and
// bytes lowered, the stand-in unmapped). The chunk itself is then unmapped
// with GlibcUnmapChunk, never freed. GlibcStandInFor gives null where the
// chunk's free moves no threshold above those moved so far, or no mapping can
// be had (then free the chunk as usual); GlibcUnmapChunk drops an unused one.
// Async-signal-safe: glibc's free of an mmapped chunk takes no lock.
void* GlibcStandInFor(const void* mem);
void GlibcFreeStandIn(void* stand_in);
void GlibcUnmapChunk(const void* mem);
// At set-up: a threshold fixed through the environment (MALLOC_MMAP_THRESHOLD_
// and its kin, GLIBC_TUNABLES' glibc.malloc.*) makes glibc's threshold static.
void GlibcNoteEnvironment();

// The block `mem` handed to free(), as glibc's free sees it first: the words
// it reads before any other (the chunk's size, and an mmapped chunk's lead),
// put through the checks it makes on them ("free(): invalid pointer",
// "free(): invalid size", "munmap_chunk(): invalid pointer"; a heap chunk
// must end within its arena: the break, or its 64 MiB heap). Nothing else is
// read, so a pointer glibc rejects is left for glibc to reject, and one whose
// header is unmapped faults there as it does bare. `usable`: what
// malloc_usable_size gives an allocated block with that header (0: glibc
// rejects it); `mmapped`: an mmapped chunk; `servable`: an allocation that
// GlibcFreshUsable describes could be given exactly such a block (an
// mmapped chunk whose lead memalign could skip for an alignment up to a page;
// not one of a larger alignment, whose lead depends on where mmap put it).
struct GlibcChunk {
  size_t usable = 0;
  bool mmapped = false;
  bool servable = false;
};
GlibcChunk GlibcChunkOf(const void* mem, size_t page);

}  // namespace lazypin
