// nvtx: what lazypin did, on an Nsight Systems timeline. Each intercepted call
// is an NVTX range in the "lazypin" domain, named by its API; each pool
// action is a marker in it ("hit", "deferred", "passthrough:<reason>",
// "evict:<reason>[:forced]"). NVTX is header-only (the CUDA toolkit's nvtx3):
// with no tool attached each call is a load and a branch; a tool (nsys, or
// any library named by NVTX_INJECTION64_PATH) is found on the first call.
#pragma once

#include "types.h"

namespace lazypin::nvtx {

// A program call starts (a range is pushed on this thread) and ends (its
// action's marker, then the range is popped). Calls nest as the hooks do.
void CallBegins(Api api);
void CallEnds(Action action, PassReason reason);
// lazypin really unregistered something (a marker on the calling thread).
void Evicted(EvictReason reason, bool forced);

}  // namespace lazypin::nvtx
