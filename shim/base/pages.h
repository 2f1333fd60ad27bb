// pages: page arithmetic on addresses, saturating at the top of the address
// space (a range that would wrap ends at UINTPTR_MAX instead).
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>

namespace lazypin {

inline uintptr_t PageSize() {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  return page;
}
inline uintptr_t PageFloor(uintptr_t a) { return a & ~(PageSize() - 1); }
// The first page boundary at or above `a`; the last page's base if that would wrap.
inline uintptr_t PageCeil(uintptr_t a) {
  const uintptr_t up = a + PageSize() - 1;
  return up < a ? ~PageSize() + 1 : PageFloor(up);
}
// base + bytes, or UINTPTR_MAX if that would wrap.
inline uintptr_t RangeEnd(uintptr_t base, size_t bytes) {
  const uintptr_t end = base + bytes;
  return end < base ? ~uintptr_t{0} : end;
}

}  // namespace lazypin
