// option_limits: the bounds of the pool and the host-allocation cache, as the
// options set them (auto-pin's: AutoPinLimitsFrom, auto_pin.h). The limit
// structs have no defaults of their own (a zero bound keeps nothing): every
// value comes from Config, whose defaults are the option table's (kOptions).
//   pool (Pool):                 LAZYPIN_POOL_BYTES, LAZYPIN_POOL_ENTRIES
//   host cache (HostAllocCache): LAZYPIN_HOST_ALLOC_CACHE, LAZYPIN_POOL_ENTRIES
//                                (its own count of blocks, apart from the pool's)
#pragma once

#include "config.h"
#include "host_alloc_cache.h"
#include "pool.h"

namespace lazypin {

inline PoolLimits PoolLimitsFrom(const Config& config) {
  PoolLimits limits;
  limits.max_bytes = config.pool_bytes;
  limits.max_entries = config.pool_entries;
  limits.check_frames = config.check_pfn;
  return limits;
}

inline HostAllocLimits HostAllocLimitsFrom(const Config& config) {
  HostAllocLimits limits;
  limits.max_bytes = config.host_alloc_bytes;
  limits.max_entries = config.pool_entries;
  return limits;
}

}  // namespace lazypin
