// cuda_pool_driver: the pool's route to the real CUDA driver (PoolDriver),
// for lazypin's own unregisters (evictions), the page-frame check and the clock.
//
// Each of lazypin's unregisters first waits, on the calling thread, for the
// GPU's work in flight in the registration's context (a thread of lazypin's
// synchronizes that context; the caller waits with a deadline), then
// unregisters: the unregister is then short, and the program's other threads
// do not wait behind it. The wait is skipped while a stream capture is in
// progress in that context (a synchronize would invalidate it), and bounded
// by kReleaseWaitNs (a GPU that never goes idle); either way the release
// goes ahead and is reported forced (ReleaseWait).
#pragma once

#include <memory>

#include "pool.h"
#include "sys.h"

namespace lazypin {

// The bound on a release's wait for the GPU.
constexpr int64_t kReleaseWaitNs = int64_t{1000} * 1000000;

class MemWatch;

// `watch` (may be null: hooks only) sees pages change; without
// `defer_shared`, shared and file-backed pages are not deferred; a miss of a
// large range is faulted in first by `prefault_threads` threads (prefault.h;
// 0 or 1: by the driver alone).
std::unique_ptr<PoolDriver> MakeCudaPoolDriver(MemWatch* watch, bool defer_shared,
                                               int prefault_threads);

// The host-allocation cache's frees (cuMemFreeHost), waited for as above.
class HostAllocDriver;
std::unique_ptr<HostAllocDriver> MakeCudaHostAllocDriver();

}  // namespace lazypin
