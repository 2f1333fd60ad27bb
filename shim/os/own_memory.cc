// own_memory: see own_memory.h.
#include "own_memory.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstdint>

#include "seccomp.h"

namespace lazypin {

bool ReadOwnMemory(void* dst, const void* src, size_t n) {
  if (SeccompFiltered()) return false;
  const pid_t self = getpid();
  size_t done = 0;
  while (done < n) {
    iovec local{static_cast<char*>(dst) + done, n - done};
    iovec remote{const_cast<char*>(static_cast<const char*>(src)) + done, n - done};
    const ssize_t got = process_vm_readv(self, &local, 1, &remote, 1, 0);
    if (got <= 0) return false;
    done += static_cast<size_t>(got);
  }
  return true;
}

void* MapScratch(size_t n) {
  const long p = syscall(SYS_mmap, nullptr, n, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p < 0 && p > -4096 ? nullptr : reinterpret_cast<void*>(p);
}

void UnmapScratch(void* p, size_t n) {
  if (p != nullptr) syscall(SYS_munmap, p, n);
}

}  // namespace lazypin
