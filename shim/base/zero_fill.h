// zero_fill: writing zeros into memory nobody reads meanwhile, with
// non-temporal stores where the CPU has them (x86-64: SSE2's movntdq). They
// go to memory without first reading each line into the caches, so zeroing
// a block ahead of its reuse neither evicts the program's working set nor
// reads the block's old bytes.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace lazypin {

inline void ZeroNonTemporal(void* p, size_t bytes) {
#if defined(__x86_64__)
  auto* at = static_cast<unsigned char*>(p);
  // The head up to a 64-byte boundary and the tail after the last whole line
  // go through memset; the lines between with streaming stores.
  const size_t head = std::min(bytes, (64 - (reinterpret_cast<uintptr_t>(at) & 63)) & 63);
  std::memset(at, 0, head);
  at += head;
  bytes -= head;
  const __m128i zero = _mm_setzero_si128();
  for (; bytes >= 64; at += 64, bytes -= 64) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(at), zero);
    _mm_stream_si128(reinterpret_cast<__m128i*>(at + 16), zero);
    _mm_stream_si128(reinterpret_cast<__m128i*>(at + 32), zero);
    _mm_stream_si128(reinterpret_cast<__m128i*>(at + 48), zero);
  }
  std::memset(at, 0, bytes);
  _mm_sfence();  // the streamed lines are visible before whoever is told next reads them
#else
  std::memset(p, 0, bytes);
#endif
}

// The size from which a block zeroed for the program is zeroed with
// non-temporal stores: three eighths of the last-level cache (as glibc's own
// threshold for non-temporal copies), 32 MiB where the CPU does not say.
// Below it memset is as fast and leaves the lines in the cache, where the
// program's first writes find them; above it they would not stay, and
// memset's read of each line first costs it most of its rate (CPU VM, 260 MiB
// L3: 22.6 GB/s at 64 MiB, 8.5 GB/s at 128 MiB, against 21-22 GB/s streamed:
// pool_bench's BM_Zero). cpuid alone: no file, no allocation.
inline size_t StreamZeroFrom() {
#if defined(__x86_64__)
  static const size_t from = [] {
    const long cache = sysconf(_SC_LEVEL3_CACHE_SIZE);
    return cache > 0 ? static_cast<size_t>(cache) / 8 * 3 : size_t{32} << 20;
  }();
  return from;
#else
  return ~size_t{0};
#endif
}

// Zeroes a block about to be handed to the program (served from what lazypin
// kept): memset below StreamZeroFrom(), non-temporal stores from it on.
inline void ZeroForProgram(void* p, size_t bytes) {
  if (bytes >= StreamZeroFrom()) {
    ZeroNonTemporal(p, bytes);
  } else {
    std::memset(p, 0, bytes);
  }
}

}  // namespace lazypin
