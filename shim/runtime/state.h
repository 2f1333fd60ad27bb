// state: what lazypin does in this process, as one immutable snapshot behind
// one atomic pointer. lifecycle.cc publishes it once set up and swaps it in a
// fork's child, on a fatal signal and at exit; the hooks only read it.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

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

// What set-up takes of the hooks above it, handed down by every hook call
// that may set lazypin up (one constant table: hooks.h's kHookSide).
struct HookSide {
  // The process's memory hooks are lazypin's and a call through them reaches
  // them; false with the reason otherwise (hooks_memory.h).
  bool (*memory_hooks_self_test)(std::string* why);
  // Freed blocks may come back: the malloc family is lazypin's over glibc's;
  // false with the reason otherwise (hooks_alloc.h).
  bool (*allocator_reuse_check)(std::string* why);
  // The next free() after lazypin's: what really frees a block lazypin kept.
  void (*real_free)(void* ptr);
  // The allocation hooks' one word (hooks_alloc.h's g_alloc_gauge).
  std::atomic<int64_t>* alloc_gauge;
};

// The published state, switched first to pass-through in a copy of the
// process that fork's handlers did not reach (a raw clone's child: see
// ProcessIdentity). For the hooks' slow paths (register, unregister,
// queries, teardown): it may cost a syscall.
const ShimState* StateInThisProcess();

// The state, setting lazypin up on first use: when CUDA is set up (cudart
// asking the driver's getter for its entry points), else in the program's
// first registration call (a program that reaches the driver without the
// getter: linked with -lcuda, or dlsym).
const ShimState* ActiveState(const HookSide& hooks);

// cudart (or a program) is asking the driver's getter for its entry points:
// CUDA is being set up. Sets lazypin up here, once, unless LAZYPIN_MODE is
// off, so that the program's first registration finds everything ready; its
// threads start first as spares (PrepareSpareThreads), and those the set-up
// did not need end. Never waits for another thread's set-up (the caller may
// be a library constructor, under the loader's lock).
void SetUpWithCuda(const HookSide& hooks);

// LAZYPIN_AUTOPIN asks for auto-pin: then a large copy may set lazypin up
// (read once, before set-up, without messages: PeekConfig).
bool AutoPinAsked();

}  // namespace lazypin
