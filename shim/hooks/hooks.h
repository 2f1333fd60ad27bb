// hooks: what the hook files share (the CUDA ones: also driver_hook.h).
// Every exported symbol of lazypin is a hook; each is a few lines into
// Dispatch (register/unregister, teardown, queries) or MemoryGuard (memory
// leaving the process), found through the published ShimState (state.h).
#pragma once

#include <cstdint>

#include "types.h"

namespace lazypin {

constexpr int kViaCount = 3;

// The getter's answer `*pfn` for `symbol` at `version` with `flags`: replaced
// by our hook when we own that entry point.
void SwapForHook(const char* symbol, int version, uint64_t flags, void** pfn);

}  // namespace lazypin
