// process: tells the process that set lazypin up from a copy of it that
// fork's handlers did not reach (a raw clone or clone3 without CLONE_VM),
// where lazypin's threads do not run and its locks may be held forever.
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace lazypin {

class ProcessIdentity {
 public:
  // In the set-up process, once.
  void Mark();
  // True in a copy of the marked process. Async-signal-safe; one load where
  // MADV_WIPEONFORK exists (Linux 4.14), else a getpid.
  bool InCopy() const;

 private:
  pid_t pid_ = 0;                   // the marked process
  const uint32_t* mark_ = nullptr;  // nonzero here, zero in a copy
};

}  // namespace lazypin
