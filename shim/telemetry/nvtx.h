// nvtx: what lazypin did, on an Nsight Systems timeline. Each intercepted call
// is an NVTX range in the "lazypin" domain, named by its API; each pool
// action is a marker in it ("hit", "deferred", "passthrough:<reason>",
// "evict:<reason>[:forced]", "autopin"). NVTX is header-only (the CUDA toolkit's nvtx3):
// with no tool attached each call is a load and a branch; a tool (nsys, or
// any library named by NVTX_INJECTION64_PATH) is found on the first call (not
// at set-up, inside CUDA's start-up: a tool's library may call CUDA itself).
#pragma once

#include "types.h"

namespace lazypin::nvtx {

// A program call starts (a range is pushed on this thread) and ends (its
// action's marker, then the range is popped). Calls nest as the hooks do.
void CallBegins(Api api);
void CallEnds(Action action, PassReason reason);
// lazypin really unregistered something (a marker on the calling thread).
void Evicted(EvictReason reason, bool forced);
// LAZYPIN_AUTOPIN registered a copy's host range ("autopin"), or the driver
// refused it ("autopin:refused"): a marker on the copying thread.
void AutoPinned(bool ok);

}  // namespace lazypin::nvtx
