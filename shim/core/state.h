// state: what lazypin does in this process, as one immutable snapshot behind
// one atomic pointer. runtime/ publishes it once set up and swaps it in a
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
// The published state's memory guard: non-null only while deferring.
inline const MemoryGuard* PublishedGuard() {
  const ShimState* state = PublishedState();
  return state != nullptr ? state->guard : nullptr;
}

// The published state, switched first to pass-through in a copy of the
// process that fork's handlers did not reach (a raw clone's child: see
// ProcessIdentity). For the hooks' slow paths (register, unregister,
// queries, teardown): it may cost a syscall.
const ShimState* StateInThisProcess();

// The state, setting lazypin up on first use: when CUDA is set up (cudart
// asking the driver's getter for its entry points), else in the program's
// first registration call (a program that reaches the driver without the
// getter: linked with -lcuda, or dlsym).
const ShimState* ActiveState();

// Sets lazypin up unless it is; true once it is. False at once when another
// thread is doing it now, rather than wait (the caller may hold the loader's
// lock, which that set-up may need: a library constructor that starts CUDA).
bool TrySetUp();

}  // namespace lazypin
