// types: the small vocabulary every part of lazypin shares: which API the
// program called and how it reached it, what lazypin did with the call, and
// why lazypin unregistered something on its own. Names as they appear in the log.
#pragma once

#include <cstdint>

namespace lazypin {

// The hooked entry points, as the program called them: registrations, then
// pinned host allocations and their frees (the host-allocation cache).
enum class Api { kCudaHostRegister, kCudaHostUnregister, kCuMemHostRegister, kCuMemHostRegisterV2,
                 kCuMemHostUnregister, kCudaHostAlloc, kCudaMallocHost, kCudaFreeHost,
                 kCuMemHostAlloc, kCuMemAllocHost, kCuMemAllocHostV2, kCuMemFreeHost, kCount };
const char* ApiName(Api api);
bool IsRegister(Api api);
// cudaHostAlloc, cudaMallocHost, cuMemHostAlloc, cuMemAllocHost(_v2) / cudaFreeHost, cuMemFreeHost.
bool IsHostAlloc(Api api);
bool IsHostFree(Api api);
inline bool IsHostAllocApi(Api api) { return IsHostAlloc(api) || IsHostFree(api); }

// How the program reached a hook.
enum class Via { kSymbol, kDlsym, kGetProc };
const char* ViaName(Via via);

// What lazypin did with one program call: forwarded it (log mode, or too
// big to pool), served a register from the pool (hit), forwarded a register
// in defer mode (miss), kept an unregister in the pool (deferred), or
// forwarded an unregister it would have kept, for a PassReason (passthrough).
enum class Action { kForward, kHit, kMiss, kDeferred, kPassthrough };
const char* ActionName(Action action);

// Why a registration is not deferred: its pages are shared or file-backed
// (they can change with no call of this process), lazypin cannot watch them,
// or they left the process while the program still held the registration.
enum class PassReason { kNone, kShared, kUnwatched, kLeft };
const char* PassReasonName(PassReason reason);

// Why lazypin really unregistered a pooled registration.
enum class EvictReason {
  kLru, kIdle, kOverlap, kMakeRoom, kQuery, kFree, kRealloc, kMunmap, kMremap, kMmapFixed,
  kMadvise, kBrk, kShmdt, kShmat, kContext, kPfn, kExit, kWatch, kFork, kMprotect,
  kDoubleFree,  // the host-allocation cache: a second free of a cached block
  kFlags,       // the host-allocation cache: an allocation with other flags (see Alloc)
  kGraph,       // a graph's memcpy node names it (recorded, instantiated or launched)
  kPressure,    // kept memory yields to the program's demand (memory_budget.h)
  kUserfaultfd,  // the program registers the range with a userfaultfd of its own
  kMemoryCall,   // the host-allocation cache: a memory call (mlock, mincore, ...) on a kept block
  kCount  // number of reasons
};
const char* EvictReasonName(EvictReason reason);

// CUDA result codes lazypin needs to know (driver and runtime agree on these).
constexpr int kCudaSuccess = 0;
constexpr int kCudaOutOfMemory = 2;
constexpr int kCudaNotInitialized = 3;
constexpr int kCudaCaptureUnsupported = 900;  // CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED

}  // namespace lazypin
