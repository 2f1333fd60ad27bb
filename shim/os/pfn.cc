// pfn: reading /proc/self/pagemap (see pfn.h).
#include "pfn.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>

#include "descriptors.h"

namespace lazypin {

bool ReadPageFrames(uintptr_t ptr, size_t bytes, std::vector<uint64_t>* frames) {
  // Opened by the first reading (a register's, on the program's thread),
  // held high and used only while it is lazypin's (descriptors.h).
  static HeldFd* const pagemap = [] {
    auto* held = new HeldFd;  // never destroyed: readings may run until the end
    held->Hold(::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC));
    return held;
  }();
  if (bytes == 0 || !pagemap->Ours()) return false;
  const int f = pagemap->get();
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t first = ptr / page, last = (ptr + bytes - 1) / page;
  frames->assign(last - first + 1, 0);
  uint64_t any = 0;
  constexpr size_t kChunk = 512;
  uint64_t buf[kChunk];
  for (uintptr_t p = first; p <= last; p += kChunk) {
    const size_t n = static_cast<size_t>(std::min<uintptr_t>(kChunk, last - p + 1));
    const ssize_t got = pread(f, buf, n * sizeof(uint64_t), static_cast<off_t>(p * sizeof(uint64_t)));
    if (got != static_cast<ssize_t>(n * sizeof(uint64_t))) return false;
    for (size_t i = 0; i < n; ++i) {
      const bool present = (buf[i] >> 63) & 1;
      const uint64_t pfn = present ? (buf[i] & ((uint64_t{1} << 55) - 1)) : 0;
      (*frames)[p - first + i] = pfn;
      any |= pfn;
    }
  }
  return any != 0;  // all zero: frame numbers hidden (not root) or nothing present
}

}  // namespace lazypin
