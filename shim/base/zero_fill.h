// zero_fill: writing zeros into memory nobody reads meanwhile, with
// non-temporal stores where the CPU has them (x86-64: SSE2's movntdq). They
// go to memory without first reading each line into the caches, so zeroing
// a block ahead of its reuse neither evicts the program's working set nor
// reads the block's old bytes.
#pragma once

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

}  // namespace lazypin
