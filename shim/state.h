// state: what lazypin does in this process, as one immutable snapshot behind
// one atomic pointer. shim.cc publishes it once set up and swaps it in a
// fork's child, on a fatal signal and at exit; the hooks only read it.
#pragma once

#include "config.h"

namespace lazypin {

class AutoPin;
class Dispatch;
class MemoryGuard;

struct ShimState {
  Mode requested;           // what LAZYPIN_MODE asked for
  Mode effective;           // what lazypin does now
  const char* why;          // why `effective` differs from `requested` ("" if it does not)
  Dispatch* dispatch;       // null: every hook passes straight through
  const MemoryGuard* guard; // non-null only while deferring: the memory hooks' sink
  AutoPin* auto_pin = nullptr;  // non-null only with LAZYPIN_AUTOPIN while deferring
};

// The published state (null before set-up or when lazypin is off). A
// builtin, not std::atomic: a sanitizer's runtime reaches the free hook
// before its shadow memory exists (see shim/CMakeLists.txt).
extern const ShimState* g_state;
inline const ShimState* PublishedState() { return __atomic_load_n(&g_state, __ATOMIC_ACQUIRE); }

// The published state, switched first to pass-through in a copy of the
// process that fork's handlers did not reach (a raw clone's child: see
// Shim::InCopiedProcess). For the hooks' slow paths (register, unregister,
// queries, teardown): it may cost a syscall.
const ShimState* StateInThisProcess();

// The state, setting lazypin up on the first call (register/unregister hooks):
// the program's first CUDA registration call is where lazypin starts.
const ShimState* ActiveState();

// Called before the program's first registration (cudart's set-up asking the
// getter for entry points), once: deferring, it does there the set-up work
// that needs no configuration beyond LAZYPIN_MODE and LAZYPIN_WATCH (the
// memory hooks' self-test, the kernel watch's open), for ActiveState's set-up
// to take in this process. Nothing when lazypin is set up already.
void PrepareSetUpEarly();

}  // namespace lazypin
