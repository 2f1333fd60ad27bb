// canary.cc: frees of pooled small blocks next to canary blocks.
// Allocators other than glibc's (jemalloc, tcmalloc, a program's own) keep
// blocks of 1 or 8 bytes side by side; whatever lazypin does when such a block
// is freed must leave its neighbours alone.
//
// Each round, for each size: 64 blocks of that size in a row, each filled
// with its own pattern; the middle one is registered, copied through
// (H2D and back) and unregistered (under defer it is pooled), then freed.
// Every other block is checked right after the free and again 20 ms later
// (the collector has freed it by then), then all are freed.
//
// Built twice: `canary` uses the process's malloc (glibc's, or a preloaded
// one), `canary_ownmalloc` brings its own (OWN_MALLOC below: it replaces
// malloc, free and the rest as the glibc manual allows, so lazypin's free
// hook never sees a free).
//
// CLI: canary [--rounds 32] [--sizes 1,8]
// Prints "CANARY size=<n> rounds=<r> damaged=<d>" per size and "CANARY ok".
// Exit: 0 ok, 1 setup, 2 data mismatch, 3 unexpected code, 4 a canary damaged.
#include "hcommon.h"

#include <malloc.h>
#include <sys/mman.h>
#include <sys/syscall.h>

#include <vector>

#ifdef OWN_MALLOC
#include <atomic>
#include <cerrno>

// A size-class allocator: class k holds blocks of 2^k bytes (8 B .. 256 MiB)
// side by side in a region of its own, so every block is aligned to its
// size; a freed block holds its class's free-list link (8 bytes), as
// tcmalloc's and many programs' allocators do. Memory comes from raw mmap
// syscalls (no hook sees them) and is never returned to the kernel.
namespace own {
constexpr int kMinShift = 3, kMaxShift = 28;
constexpr size_t kRegion = size_t{1} << 30;
constexpr int kClasses = kMaxShift - kMinShift + 1;
char* g_base = nullptr;
void* g_free[kClasses];
size_t g_used[kClasses];
std::atomic_flag g_lock = ATOMIC_FLAG_INIT;

struct Lock {
  Lock() { while (g_lock.test_and_set(std::memory_order_acquire)) {} }
  ~Lock() { g_lock.clear(std::memory_order_release); }
};

int ClassOf(size_t n, size_t align) {
  if (align > n) n = align;
  int shift = kMinShift;
  while (shift <= kMaxShift && (size_t{1} << shift) < n) ++shift;
  return shift > kMaxShift ? -1 : shift - kMinShift;
}

bool Init() {
  if (g_base != nullptr) return true;
  const size_t span = (kClasses + 1) * kRegion;
  const long got = syscall(SYS_mmap, nullptr, span, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (got < 0 && got > -4096) return false;
  g_base = reinterpret_cast<char*>((static_cast<uintptr_t>(got) + kRegion - 1) & ~(kRegion - 1));
  return true;
}

void* Alloc(size_t n, size_t align) {
  const int c = ClassOf(n == 0 ? 1 : n, align);
  if (c < 0) {
    errno = ENOMEM;
    return nullptr;
  }
  Lock lock;
  if (!Init()) {
    errno = ENOMEM;
    return nullptr;
  }
  if (void* p = g_free[c]) {
    g_free[c] = *static_cast<void**>(p);
    return p;
  }
  const size_t size = size_t{1} << (c + kMinShift);
  if ((g_used[c] + 1) * size > kRegion) {
    errno = ENOMEM;
    return nullptr;
  }
  return g_base + c * kRegion + g_used[c]++ * size;
}

// The block's class, or -1 if it is not one of ours.
int ClassOfBlock(const void* p) {
  const char* q = static_cast<const char*>(p);
  if (g_base == nullptr || q < g_base || q >= g_base + kClasses * kRegion) return -1;
  return static_cast<int>((q - g_base) / kRegion);
}

void Free(void* p) {
  const int c = ClassOfBlock(p);
  if (c < 0) return;
  Lock lock;
  *static_cast<void**>(p) = g_free[c];
  g_free[c] = p;
}

size_t Usable(const void* p) {
  const int c = ClassOfBlock(p);
  return c < 0 ? 0 : size_t{1} << (c + kMinShift);
}
}  // namespace own

extern "C" {
void* malloc(size_t n) { return own::Alloc(n, 8); }
void free(void* p) { own::Free(p); }
void cfree(void* p) { own::Free(p); }
void* calloc(size_t n, size_t size) {
  if (size != 0 && n > SIZE_MAX / size) {
    errno = ENOMEM;
    return nullptr;
  }
  void* p = own::Alloc(n * size, 8);
  if (p != nullptr) std::memset(p, 0, n * size);
  return p;
}
void* realloc(void* p, size_t n) {
  if (p == nullptr) return own::Alloc(n, 8);
  const size_t have = own::Usable(p);
  if (n <= have && n != 0) return p;
  void* q = own::Alloc(n, 8);
  if (q != nullptr) {
    std::memcpy(q, p, have < n ? have : n);
    own::Free(p);
  }
  return q;
}
void* reallocarray(void* p, size_t n, size_t size) {
  if (size != 0 && n > SIZE_MAX / size) {
    errno = ENOMEM;
    return nullptr;
  }
  return realloc(p, n * size);
}
size_t malloc_usable_size(void* p) { return own::Usable(p); }
void* memalign(size_t align, size_t n) { return own::Alloc(n, align); }
void* aligned_alloc(size_t align, size_t n) { return own::Alloc(n, align); }
int posix_memalign(void** out, size_t align, size_t n) {
  void* p = own::Alloc(n, align);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}
void* valloc(size_t n) { return own::Alloc(n, 4096); }
void* pvalloc(size_t n) { return own::Alloc((n + 4095) & ~size_t{4095}, 4096); }
}
#endif  // OWN_MALLOC

namespace {

constexpr int kBlocks = 64, kPooled = kBlocks / 2;

unsigned char Pattern(int round, int block, size_t byte) {
  return static_cast<unsigned char>(0x5A ^ (round * 131 + block * 7 + static_cast<int>(byte)));
}

// The blocks whose bytes are no longer what was written (the pooled one freed).
int Damaged(const std::vector<unsigned char*>& blocks, size_t size, int round) {
  int damaged = 0;
  for (int b = 0; b < kBlocks; ++b) {
    if (b == kPooled) continue;
    for (size_t i = 0; i < size; ++i) {
      if (blocks[b][i] != Pattern(round, b, i)) {
        std::fprintf(stderr, "DAMAGED size=%zu round=%d block %+d (%p, pooled %p) byte %zu\n",
                     size, round, b - kPooled, static_cast<void*>(blocks[b]),
                     static_cast<void*>(blocks[kPooled]), i);
        ++damaged;
        break;
      }
    }
  }
  return damaged;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = static_cast<int>(hard::arg_double(argc, argv, "--rounds", 32));
  std::vector<size_t> sizes = {1, 8};
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--sizes") == 0) {
      sizes.clear();
      for (char* s = argv[i + 1]; *s != '\0';) {
        sizes.push_back(std::strtoul(s, &s, 10));
        if (*s == ',') ++s;
      }
    }
  }
  void* dev = nullptr;
  EXPECT(cudaMalloc(&dev, 4096), 0);
  unsigned char check[4096];
  int total_damaged = 0;
  for (size_t size : sizes) {
    if (size == 0 || size > sizeof check) return 1;
    int damaged = 0;
    for (int r = 0; r < rounds; ++r) {
      std::vector<unsigned char*> blocks(kBlocks);
      for (int b = 0; b < kBlocks; ++b) {
        blocks[b] = static_cast<unsigned char*>(std::malloc(size));
        if (blocks[b] == nullptr) return 1;
        for (size_t i = 0; i < size; ++i) blocks[b][i] = Pattern(r, b, i);
      }
      unsigned char* pooled = blocks[kPooled];
      EXPECT(cudaHostRegister(pooled, size, 0), 0);
      EXPECT(cudaMemcpy(dev, pooled, size, cudaMemcpyHostToDevice), 0);
      EXPECT(cudaMemcpy(check, dev, size, cudaMemcpyDeviceToHost), 0);
      if (std::memcmp(check, pooled, size) != 0) {
        std::fprintf(stderr, "DATA MISMATCH size=%zu round=%d\n", size, r);
        return 2;
      }
      EXPECT(cudaHostUnregister(pooled), 0);
      std::free(pooled);
      damaged += Damaged(blocks, size, r);
      usleep(20000);
      damaged += Damaged(blocks, size, r);
      for (int b = 0; b < kBlocks; ++b) {
        if (b != kPooled) std::free(blocks[b]);
      }
    }
    std::printf("CANARY size=%zu rounds=%d damaged=%d\n", size, rounds, damaged);
    total_damaged += damaged;
  }
  EXPECT(cudaFree(dev), 0);
  if (total_damaged != 0) return 4;
  std::printf("CANARY ok\n");
  return 0;
}
