// cuda_pool_driver: the pool's route to the real CUDA driver (PoolDriver),
// for lazypin's own unregisters (evictions), the page-frame check and the clock.
#pragma once

#include <memory>

#include "pool.h"

namespace lazypin {

// Monotonic clock in nanoseconds.
int64_t MonotonicNs();

class MemWatch;

// `watch` (may be null: hooks only) sees pages change; without
// `defer_shared`, shared and file-backed pages are not deferred.
std::unique_ptr<PoolDriver> MakeCudaPoolDriver(MemWatch* watch, bool defer_shared);

}  // namespace lazypin
