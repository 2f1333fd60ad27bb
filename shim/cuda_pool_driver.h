// cuda_pool_driver: the pool's route to the real CUDA driver (PoolDriver),
// for lazypin's own unregisters (evictions), the page-frame check and the clock.
#pragma once

#include "pool.h"

namespace lazypin {

// Monotonic clock in nanoseconds.
int64_t MonotonicNs();

std::unique_ptr<PoolDriver> MakeCudaPoolDriver();

}  // namespace lazypin
