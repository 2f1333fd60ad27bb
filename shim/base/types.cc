// types: names of the shared enums, as the log spells them (see types.h).
#include "types.h"

namespace lazypin {

const char* ApiName(Api api) {
  switch (api) {
    case Api::kCudaHostRegister: return "cudaHostRegister";
    case Api::kCudaHostUnregister: return "cudaHostUnregister";
    case Api::kCuMemHostRegister: return "cuMemHostRegister";
    case Api::kCuMemHostRegisterV2: return "cuMemHostRegister_v2";
    case Api::kCuMemHostUnregister: return "cuMemHostUnregister";
    case Api::kCudaHostAlloc: return "cudaHostAlloc";
    case Api::kCudaMallocHost: return "cudaMallocHost";
    case Api::kCudaFreeHost: return "cudaFreeHost";
    case Api::kCuMemHostAlloc: return "cuMemHostAlloc";
    case Api::kCuMemAllocHost: return "cuMemAllocHost";
    case Api::kCuMemAllocHostV2: return "cuMemAllocHost_v2";
    case Api::kCuMemFreeHost: return "cuMemFreeHost";
    case Api::kCount: break;
  }
  return "?";
}

bool IsRegister(Api api) {
  return api == Api::kCudaHostRegister || api == Api::kCuMemHostRegister ||
         api == Api::kCuMemHostRegisterV2;
}

bool IsHostAlloc(Api api) {
  return api == Api::kCudaHostAlloc || api == Api::kCudaMallocHost || api == Api::kCuMemHostAlloc ||
         api == Api::kCuMemAllocHost || api == Api::kCuMemAllocHostV2;
}

bool IsHostFree(Api api) { return api == Api::kCudaFreeHost || api == Api::kCuMemFreeHost; }

const char* ViaName(Via via) {
  switch (via) {
    case Via::kSymbol: return "symbol";
    case Via::kDlsym: return "dlsym";
    case Via::kGetProc: return "getproc";
  }
  return "symbol";
}

const char* ActionName(Action action) {
  switch (action) {
    case Action::kForward: return "forward";
    case Action::kHit: return "hit";
    case Action::kMiss: return "miss";
    case Action::kDeferred: return "deferred";
    case Action::kPassthrough: return "passthrough";
  }
  return "forward";
}

const char* PassReasonName(PassReason reason) {
  switch (reason) {
    case PassReason::kNone: return "";
    case PassReason::kShared: return "shared";
    case PassReason::kUnwatched: return "unwatched";
    case PassReason::kLeft: return "left";
  }
  return "";
}

const char* EvictReasonName(EvictReason reason) {
  static constexpr const char* kNames[] = {
      "lru",    "idle",   "overlap",    "make_room", "query", "free",  "realloc",
      "munmap", "mremap", "mmap_fixed", "madvise",   "brk",   "shmdt", "shmat",
      "context", "pfn",   "exit",       "watch",     "fork",    "mprotect", "double_free",
      "flags",  "graph", "pressure", "userfaultfd", "memory_call"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == static_cast<int>(EvictReason::kCount));
  return kNames[static_cast<int>(reason)];
}

}  // namespace lazypin
