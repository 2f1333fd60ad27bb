// hooks: what the hook files share (hooks_runtime.cc, hooks_driver.cc).
// Every exported symbol of lazypin is a hook; each is a few lines into
// Dispatch (register/unregister, teardown, queries) or MemoryGuard (memory
// leaving the process), found through the published ShimState (state.h).
#pragma once

#include <cstdint>

#include "types.h"

namespace lazypin {

constexpr int kViaCount = 3;

// The runtime hook copy for a door (`name` is cudaHostRegister or
// cudaHostUnregister), for our dlsym.
void* RuntimeHookOf(const char* name, Via via);
// Hands that copy its real function; false if it already has another one.
bool OfferRuntimeReal(const char* name, Via via, void* fn);

// The getter's answer `*pfn` for `symbol` at `version` with `flags`: replaced
// by our hook when we own that entry point.
void SwapForHook(const char* symbol, int version, uint64_t flags, void** pfn);

}  // namespace lazypin
