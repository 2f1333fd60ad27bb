// glibc_blocks: see glibc_blocks.h (the formulas are glibc malloc.c's).
#include "glibc_blocks.h"

namespace lazypin {
namespace {

constexpr size_t kSizeSz = 8;        // SIZE_SZ
constexpr size_t kAlignMask = 15;    // MALLOC_ALIGNMENT - 1
constexpr size_t kMinSize = 32;      // MINSIZE
constexpr size_t kChunkHdr = 16;     // CHUNK_HDR_SZ
constexpr size_t kMmapFloor = size_t{128} << 10;  // DEFAULT_MMAP_THRESHOLD_MIN

size_t Request2Size(size_t n) {
  return n + kSizeSz + kAlignMask < kMinSize ? kMinSize : (n + kSizeSz + kAlignMask) & ~kAlignMask;
}
size_t AlignUp(size_t n, size_t a) { return (n + a - 1) & ~(a - 1); }

void Add(FreshSizes* out, size_t usable) {
  for (int i = 0; i < out->count; ++i) {
    if (out->usable[i] == usable) return;
  }
  if (out->count < FreshSizes::kMax) out->usable[out->count++] = usable;
}

}  // namespace

FreshSizes GlibcFreshUsable(size_t bytes, size_t align, size_t page) {
  FreshSizes out;
  // Requests glibc refuses (PTRDIFF_MAX and above) never match anything.
  if (bytes >= (~size_t{0} >> 1) - 2 * page) return out;
  const size_t nb = Request2Size(bytes);
  const bool aligned = align > kAlignMask + 1;
  Add(&out, nb - kSizeSz);
  Add(&out, nb + 16 - kSizeSz);
  if (aligned) Add(&out, nb + 32 - kSizeSz);
  if (!aligned) {
    if (nb >= kMmapFloor) Add(&out, AlignUp(nb + kSizeSz, page) - kChunkHdr);
  } else if (align <= page && (align & (align - 1)) == 0) {
    // memalign mallocs bytes + align + MINSIZE, then skips a lead: the first
    // aligned address whose chunk header leaves at least MINSIZE before it.
    const size_t outer = Request2Size(nb + align + kMinSize);
    if (outer >= kMmapFloor) {
      size_t lead = align - kChunkHdr;
      if (lead < kMinSize) lead += align;
      const size_t mapped = AlignUp(outer + kSizeSz, page);
      Add(&out, mapped - lead - kChunkHdr);
    }
  }
  return out;
}

}  // namespace lazypin
