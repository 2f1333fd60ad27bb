// hooks: what the hook files share (the CUDA ones: also driver_hook.h).
// Every exported symbol of lazypin is a hook; each is a few lines into
// Dispatch (register/unregister, teardown, queries) or MemoryGuard (memory
// leaving the process), found through the published ShimState (state.h).
#pragma once

#include <cstdint>

#include "state.h"
#include "types.h"

namespace lazypin {

constexpr int kViaCount = 3;

// What set-up takes of the hooks (state.h), handed to every call that may set
// lazypin up. A constant: it is there before any constructor runs.
extern const HookSide kHookSide;

// The getter's answer `*pfn` for `symbol` at `version` with `flags`: replaced
// by our hook when we own that entry point.
void SwapForHook(const char* symbol, int version, uint64_t flags, void** pfn);

}  // namespace lazypin
