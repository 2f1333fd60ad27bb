// types: the small vocabulary every part of lazypin shares: which API the
// program called and how it reached it, what lazypin did with the call, and
// why lazypin unregistered something on its own. Names as they appear in the log.
#pragma once

#include <cstdint>

namespace lazypin {

// The five hooked entry points, as the program called them.
enum class Api { kCudaHostRegister, kCudaHostUnregister, kCuMemHostRegister, kCuMemHostRegisterV2,
                 kCuMemHostUnregister, kCount };
const char* ApiName(Api api);
bool IsRegister(Api api);

// How the program reached a hook.
enum class Via { kSymbol, kDlsym, kGetProc };
const char* ViaName(Via via);

// What lazypin did with one program call: forwarded it (log mode, or not
// poolable), served a register from the pool (hit), forwarded a register in
// defer mode (miss), kept an unregister in the pool (deferred).
enum class Action { kForward, kHit, kMiss, kDeferred };
const char* ActionName(Action action);

// Why lazypin really unregistered a pooled registration.
enum class EvictReason {
  kLru, kIdle, kOverlap, kMakeRoom, kQuery, kFree, kRealloc, kMunmap, kMremap, kMmapFixed,
  kMadvise, kBrk, kShmdt, kShmat, kContext, kPfn, kExit, kFork, kMprotect,
  kCount  // number of reasons
};
const char* EvictReasonName(EvictReason reason);

// CUDA result codes lazypin needs to know (driver and runtime agree on these).
constexpr int kCudaSuccess = 0;
constexpr int kCudaOutOfMemory = 2;
constexpr int kCudaNotInitialized = 3;

}  // namespace lazypin
