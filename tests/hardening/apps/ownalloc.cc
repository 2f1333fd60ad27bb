// ownalloc.cc: a program with its own mmap-based allocator. It maps one arena,
// carves page-aligned buffers out of it, registers / copies / unregisters them,
// and recycles memory the way such allocators do: munmap of a buffer + mmap
// MAP_FIXED at the same address, mmap(MAP_FIXED) over a live buffer,
// madvise(DONTNEED) of a buffer, and finally mmap(MAP_FIXED) over the whole arena.
// Deterministic: prints one line per round with the codes seen.
// CLI: ownalloc [--rounds 200]
#include "hcommon.h"

#include <sys/mman.h>

int main(int argc, char** argv) {
  const int rounds = static_cast<int>(hard::arg_double(argc, argv, "--rounds", 200));
  const size_t kBuf = 64 * hard::kPage, kCount = 32, kArena = kBuf * kCount;
  void* dev = nullptr;
  EXPECT(cudaMalloc(&dev, kBuf), 0);
  auto* check = static_cast<unsigned char*>(std::malloc(kBuf));
  auto* arena = static_cast<unsigned char*>(
      mmap(nullptr, kArena, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (arena == MAP_FAILED) return 1;
  unsigned long regs = 0, remaps = 0;
  const int kFixed = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED;
  for (int r = 0; r < rounds; ++r) {
    int codes[4] = {0, 0, 0, 0};
    for (size_t k = 0; k < kCount; ++k) {
      unsigned char* p = arena + k * kBuf;
      int a = cudaHostRegister(p, kBuf, 0);
      if (a == 0) hard::roundtrip(p, kBuf, dev, check, static_cast<unsigned>(r * 31 + k));
      int b = cudaHostUnregister(p);
      codes[0] |= a;
      codes[1] |= b;
      ++regs;
    }
    // Recycle: which buffers and how depends on the round only.
    for (size_t k = r % 3; k < kCount; k += 3) {
      unsigned char* p = arena + k * kBuf;
      switch ((r + k) % 3) {
        case 0:
          munmap(p, kBuf);
          if (mmap(p, kBuf, PROT_READ | PROT_WRITE, kFixed, -1, 0) != p) return 1;
          break;
        case 1:
          if (mmap(p, kBuf, PROT_READ | PROT_WRITE, kFixed, -1, 0) != p) return 1;
          break;
        case 2:
          madvise(p, kBuf, MADV_DONTNEED);
          break;
      }
      ++remaps;
    }
    if (r % 50 == 49) {
      if (mmap(arena, kArena, PROT_READ | PROT_WRITE, kFixed, -1, 0) != arena) return 1;
      ++remaps;
    }
    // A registration spanning two buffers, after their recycling.
    int c = cudaHostRegister(arena + kBuf / 2, kBuf, 0);
    if (c == 0) hard::roundtrip(arena + kBuf / 2, kBuf, dev, check, static_cast<unsigned>(r));
    int d = cudaHostUnregister(arena + kBuf / 2);
    std::printf("round %d register|=%d unregister|=%d span=%d,%d\n", r, codes[0], codes[1], c, d);
  }
  munmap(arena, kArena);
  std::printf("OWNALLOC rounds=%d registers=%lu recycled=%lu ok\n", rounds, regs, remaps);
  return 0;
}
