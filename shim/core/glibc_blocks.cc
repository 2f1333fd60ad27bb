// glibc_blocks: see glibc_blocks.h (the formulas are glibc malloc.c's).
#include "glibc_blocks.h"

#include <malloc.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace lazypin {
namespace {

constexpr size_t kSizeSz = 8;        // SIZE_SZ
constexpr size_t kAlignMask = 15;    // MALLOC_ALIGNMENT - 1
constexpr size_t kMinSize = 32;      // MINSIZE
constexpr size_t kChunkHdr = 16;     // CHUNK_HDR_SZ
constexpr size_t kIsMmapped = 2;    // IS_MMAPPED
constexpr size_t kNonMainArena = 4; // NON_MAIN_ARENA
constexpr uintptr_t kHeapMax = uintptr_t{64} << 20;  // HEAP_MAX_SIZE (LP64)
constexpr size_t kSizeBits = 7;     // SIZE_BITS

// What the program set with mallopt (never reset: glibc keeps it too). A
// threshold of 0 is valid (glibc then mmaps what its bins and top cannot give).
std::atomic<size_t> g_mmap_threshold{kGlibcMmapFloor};
std::atomic<bool> g_mmap_none{false};
// glibc's no_dyn_threshold: set by mallopt of the threshold, the trim
// threshold, the top pad or the mmap count, and by their tunables.
std::atomic<bool> g_static_threshold{false};
constexpr size_t kDynamicThresholdMax = size_t{32} << 20;  // DEFAULT_MMAP_THRESHOLD_MAX (LP64)
// The highest threshold the stand-ins' frees may have raised glibc's to
// (glibc's own is at least this).
std::atomic<size_t> g_stand_in_threshold{kGlibcMmapFloor};

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

FreshSizes GlibcFreshUsable(size_t bytes, size_t align, size_t page, size_t mmap_floor) {
  FreshSizes out;
  // Requests glibc refuses (PTRDIFF_MAX and above) never match anything.
  if (bytes >= (~size_t{0} >> 1) - 2 * page) return out;
  const size_t nb = Request2Size(bytes);
  const bool aligned = align > kAlignMask + 1;
  Add(&out, nb - kSizeSz);
  Add(&out, nb + 16 - kSizeSz);
  if (aligned) Add(&out, nb + 32 - kSizeSz);
  if (!aligned) {
    if (nb >= mmap_floor) Add(&out, AlignUp(nb + kSizeSz, page) - kChunkHdr);
  } else if (align <= page && (align & (align - 1)) == 0) {
    // memalign mallocs bytes + align + MINSIZE, then skips a lead: the first
    // aligned address whose chunk header leaves at least MINSIZE before it.
    const size_t outer = Request2Size(nb + align + kMinSize);
    if (outer >= mmap_floor) {
      size_t lead = align - kChunkHdr;
      if (lead < kMinSize) lead += align;
      const size_t mapped = AlignUp(outer + kSizeSz, page);
      Add(&out, mapped - lead - kChunkHdr);
    }
  }
  return out;
}

void GlibcNoteMallopt(int param, int value) {
  if (param == M_MMAP_THRESHOLD || param == M_TRIM_THRESHOLD || param == M_TOP_PAD ||
      param == M_MMAP_MAX) {
    g_static_threshold.store(true, std::memory_order_relaxed);
  }
  if (param == M_MMAP_THRESHOLD) {
    g_mmap_threshold.store(static_cast<size_t>(value), std::memory_order_relaxed);
  } else if (param == M_MMAP_MAX) {
    g_mmap_none.store(value <= 0, std::memory_order_relaxed);
  }
}

bool GlibcFreeMovesThreshold(size_t chunk_bytes) {
  return !g_static_threshold.load(std::memory_order_relaxed) && chunk_bytes <= kDynamicThresholdMax;
}

}  // namespace lazypin

extern "C" void __libc_free(void*);  // glibc's own, past every interposer

namespace lazypin {

void* GlibcStandInFor(const void* mem) {
  size_t lead, head;
  memcpy(&lead, static_cast<const char*>(mem) - kChunkHdr, sizeof lead);
  memcpy(&head, static_cast<const char*>(mem) - kSizeSz, sizeof head);
  const size_t size = head & ~kSizeBits;
  if ((head & kIsMmapped) == 0 || !GlibcFreeMovesThreshold(size) ||
      size <= g_stand_in_threshold.load(std::memory_order_relaxed)) {
    return nullptr;
  }
  const int saved = errno;
  const long map = syscall(SYS_mmap, nullptr, lead + size, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  errno = saved;
  if (map == -1) return nullptr;
  char* chunk = reinterpret_cast<char*>(map) + lead;
  memcpy(chunk, &lead, sizeof lead);
  memcpy(chunk + kSizeSz, &head, sizeof head);
  return chunk + kChunkHdr;
}

void GlibcFreeStandIn(void* stand_in) {
  size_t head;
  memcpy(&head, static_cast<const char*>(stand_in) - kSizeSz, sizeof head);
  const int saved = errno;
  __libc_free(stand_in);
  errno = saved;
  const size_t size = head & ~kSizeBits;
  size_t seen = g_stand_in_threshold.load(std::memory_order_relaxed);
  while (seen < size && !g_stand_in_threshold.compare_exchange_weak(seen, size,
                                                                    std::memory_order_relaxed)) {
  }
}

void GlibcUnmapChunk(const void* mem) {
  size_t lead, head;
  memcpy(&lead, static_cast<const char*>(mem) - kChunkHdr, sizeof lead);
  memcpy(&head, static_cast<const char*>(mem) - kSizeSz, sizeof head);
  const int saved = errno;
  syscall(SYS_munmap, static_cast<const char*>(mem) - kChunkHdr - lead, lead + (head & ~kSizeBits));
  errno = saved;
}

void GlibcNoteEnvironment() {
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                           "MALLOC_MMAP_MAX_"}) {
    if (getenv(name) != nullptr) g_static_threshold.store(true, std::memory_order_relaxed);
  }
  const char* tunables = getenv("GLIBC_TUNABLES");
  if (tunables == nullptr) return;
  for (const char* name : {"glibc.malloc.mmap_threshold=", "glibc.malloc.trim_threshold=",
                           "glibc.malloc.top_pad=", "glibc.malloc.mmap_max="}) {
    if (strstr(tunables, name) != nullptr) g_static_threshold.store(true, std::memory_order_relaxed);
  }
}

size_t GlibcMmapFloorNow() {
  if (g_mmap_none.load(std::memory_order_relaxed)) return kGlibcNoMmap;
  return g_mmap_threshold.load(std::memory_order_relaxed);
}

GlibcChunk GlibcChunkOf(const void* mem, size_t page) {
  GlibcChunk out;
  const uintptr_t chunk = reinterpret_cast<uintptr_t>(mem) - kChunkHdr;
  size_t head;
  memcpy(&head, static_cast<const char*>(mem) - kSizeSz, sizeof head);
  const size_t size = head & ~kSizeBits;
  if (chunk > -size || (reinterpret_cast<uintptr_t>(mem) & kAlignMask) != 0) return out;
  if (size < kMinSize || (size & kAlignMask) != 0) return out;
  if ((head & kIsMmapped) == 0) {
    // Within its arena, as glibc's free checks before it reads the next
    // chunk ("double free or corruption (out)"): the main arena's heap ends
    // at the break, another arena's chunk lies in its 64 MiB heap.
    const uintptr_t end = chunk + size;
    if ((head & kNonMainArena) == 0) {
      if (end > reinterpret_cast<uintptr_t>(sbrk(0))) return out;
    } else if ((chunk & ~(kHeapMax - 1)) != ((end - 1) & ~(kHeapMax - 1))) {
      return out;
    }
    out.usable = size - kSizeSz;  // memsize(): in use, as a block being freed is
    out.servable = true;
    return out;
  }
  size_t lead;  // prev_size: the chunk's offset in its mapping
  memcpy(&lead, reinterpret_cast<const void*>(chunk), sizeof lead);
  if (((chunk - lead) | (lead + size)) & (page - 1)) return out;
  out.usable = size - kChunkHdr;
  out.mmapped = true;
  // GlibcFreshUsable's leads: none (malloc), or memalign's for a power of two
  // from 32 to a page (align - 16, or 48 for 32). A larger alignment's lead is
  // a multiple of the page less 16, the first of which (page - 16) looks like
  // a page's; such a block is servable only to a request of a page's alignment.
  const size_t align = lead + kChunkHdr;
  out.servable = lead == 0 || lead == kMinSize + kChunkHdr ||
                 (align >= 64 && align <= page && (align & (align - 1)) == 0);
  return out;
}

}  // namespace lazypin
