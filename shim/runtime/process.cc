// process: the set-up process or a copy of it (see process.h).
#include "process.h"

#include <sys/mman.h>
#include <unistd.h>

#include "seccomp.h"

namespace lazypin {

void ProcessIdentity::Mark() {
  // A page the kernel hands zeroed to a child with its own copy of the memory
  // (fork, clone without CLONE_VM: MADV_WIPEONFORK), and shares unchanged
  // with a child that shares the memory (vfork, posix_spawn's CLONE_VM child,
  // a thread): one load tells this process from a copy, and a CLONE_VM child
  // never switches its parent's state. Without it, the pid recorded here (a
  // syscall per check; a CLONE_VM child that calls into lazypin between its
  // clone and its exec then counts as a copy).
  pid_ = getpid();
  if (SeccompFilterSeen()) return;  // madvise(MADV_WIPEONFORK) may be forbidden: the pid
  void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) return;
  if (madvise(page, 4096, MADV_WIPEONFORK) != 0) {
    munmap(page, 4096);
    return;
  }
  *static_cast<uint32_t*>(page) = 1;
  mark_ = static_cast<const uint32_t*>(page);
}

bool ProcessIdentity::InCopy() const {
  if (mark_ != nullptr) return __atomic_load_n(mark_, __ATOMIC_RELAXED) == 0;
  return getpid() != pid_;
}

}  // namespace lazypin
