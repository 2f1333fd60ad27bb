// option_limits: the bounds of the pool, the host-allocation cache and auto-pin, as
// the options set them. The limit structs have no defaults of their own (a
// zero bound keeps nothing): every value comes from Config, whose defaults are
// the option table's (kOptions).
//   pool (Pool):                 LAZYPIN_POOL_BYTES, LAZYPIN_POOL_ENTRIES
//   host cache (HostAllocCache): LAZYPIN_HOST_ALLOC_CACHE, LAZYPIN_POOL_ENTRIES
//                                (its own count of blocks, apart from the pool's)
//   auto-pin (AutoPin):          LAZYPIN_AUTOPIN_MIN, LAZYPIN_AUTOPIN_BYTES,
//                                LAZYPIN_AUTOPIN_AFTER (inside the pool's bounds)
#pragma once

#include "auto_pin.h"
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

inline AutoPinLimits AutoPinLimitsFrom(const Config& config) {
  AutoPinLimits limits;
  limits.min_bytes = config.autopin_min;
  limits.max_bytes = config.autopin_bytes;
  limits.after = static_cast<int>(config.autopin_after);
  return limits;
}

}  // namespace lazypin
