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
// large range is faulted in first by at most `prefault_threads` threads,
// asking for huge pages with `prefault_huge` (prefault.h; 0 or 1 thread: by
// the driver alone).
std::unique_ptr<PoolDriver> MakeCudaPoolDriver(MemWatch* watch, bool defer_shared,
                                               int prefault_threads, bool prefault_huge = false);

// The host-allocation cache's frees (cuMemFreeHost), waited for as above.
class HostAllocDriver;
std::unique_ptr<HostAllocDriver> MakeCudaHostAllocDriver();

// Several devices. The driver's unregister and host free wait for the work in
// flight on every device (unified addressing; docs/design.md, "Several
// devices"), so each of lazypin's releases, and the program-visible wait of a
// deferred unregister or a kept free, covers the other devices too: their
// active primary contexts. With one device there are none and nothing
// changes.
constexpr int kMaxDevices = 64;  // devices past this one are not waited for
// The driver's device count (cuDeviceGetCount, asked once it succeeds); 1 until then.
int DeviceCount();
// `device`'s primary context while it is active (cuDevicePrimaryCtxGetState),
// learned with a retain and a release, which leave an active context as it
// was; null when inactive or unknown.
Context ActivePrimaryContext(int device);
// The contexts that wait covers besides `own`, into `out` (at most `max`;
// returns how many): the other devices' active primary contexts, and every
// other context lazypin has a waiter for. None with one device. Creates a
// waiter thread for each primary context (never call it in a release).
int OtherDeviceContexts(Context own, Context* out, int max);

}  // namespace lazypin
