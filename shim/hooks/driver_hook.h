// driver_hook: how a hook of a CUDA entry point is made (HOOK_WITH, HOOK,
// RECORDED_HOOK) and named in the door table (HookEntry, ENTRY), for the
// files that hold them: hooks_driver.cc (registration, host allocations,
// context teardown, pointer queries, the getter, and the doors that read the
// tables: dlsym and cuGetProcAddress), hooks_copies.cc, hooks_capture.cc,
// hooks_graphs.cc and the runtime's, hooks_runtime.cc. Each file lists its
// hooks in a table of its own.
#pragma once

// Every versioned name (cuMemHostRegister and cuMemHostRegister_v2 alike)
// must stay itself here, not be renamed by cuda.h's #defines.
#define __CUDA_API_VERSION_INTERNAL 1
#include <climits>
#include <cstddef>
#include <cstdint>

#include "cuda.h"
#include "dispatch.h"
#include "export.h"
#include "hooks.h"
#include "real.h"
#include "state.h"
#include "thread_state.h"

namespace lazypin {

// A hooked entry point: how it is named to dlsym and to the getter, and its
// three hook copies with a way to hand each its real function.
struct HookEntry {
  const char* name;       // exported symbol and dlsym name, e.g. "cuMemHostRegister_v2"
  const char* proc_name;  // name the getter is asked, e.g. "cuMemHostRegister"
  int min_version, max_version;  // getter cudaVersion range this entry serves
  // Which getter flags it serves: the per-thread-default-stream variant
  // (CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, a `_ptsz` function) is a
  // different entry point from the legacy one; most are the same for both.
  enum class Stream { kAny, kLegacy, kPerThread } stream;
  void* (*hook)(Via via);
  bool (*offer)(Via via, void* real);  // false: keep the real function, no hook
};

// One file's hooks: a constant array, so that a lookup made before any
// constructor ran (another library's dlsym) finds it whole.
struct HookTable {
  const HookEntry* entries;
  size_t count;
};
HookTable DoorHooks();     // hooks_driver.cc
HookTable CopyHooks();     // hooks_copies.cc
HookTable CaptureHooks();  // hooks_capture.cc
HookTable GraphHooks();    // hooks_graphs.cc
HookTable RuntimeHooks();  // hooks_runtime.cc

// The real function `name`: the next object's, else the driver's.
void* DriverSymbol(const char* name);

// The capture recording work on `stream` now (its tracker key), or 0: none,
// or unknown. One relaxed load when nothing captures. (hooks_capture.cc)
uint64_t RecordingCapture(CUstream stream);

// A memcpy node of `owner` (a graph or an executable graph; null: unknown)
// names host memory [lo, hi): noted, and deferred entries there released.
// (hooks_graphs.cc)
void NoteGraphRange(Dispatch* dispatch, const void* owner, uintptr_t lo, uintptr_t hi);

// The dispatch when lazypin is active and this is not lazypin's own call; else null.
inline Dispatch* ActiveDispatch() { return t_state.inside ? nullptr : ActiveState(kHookSide)->dispatch; }
// The same without setting lazypin up (teardown and queries need no set-up).
inline Dispatch* PublishedDispatch() {
  const ShimState* state = t_state.inside ? nullptr : StateInThisProcess();
  return state != nullptr ? state->dispatch : nullptr;
}
// The dispatch when lazypin defers (graph ranges matter only then).
inline Dispatch* DeferringDispatch() {
  Dispatch* dispatch = PublishedDispatch();
  return dispatch != nullptr && dispatch->pool() != nullptr ? dispatch : nullptr;
}

}  // namespace lazypin

// HOOK(NAME, RET, RESOLVE, (T1, a1), (T2, a2), ...) { body using `real`, `V` and a1... }
// defines the three copies Hook_NAME<Via>, each with its own real-function slot
// (resolved by RESOLVE for the symbol door, offered by dlsym or the getter for
// the others), and exports NAME itself. Each parameter is written once.
// RECORDED_HOOK: the same for a call the log records, whose body also has
// `caller` (dispatch.h's Caller), taken in Hook_NAME and in NAME, the
// functions the program calls; HOOK's `caller` is empty (no frame pointer forced).
// Both return CUDA_ERROR_NOT_INITIALIZED where the real function cannot be
// found; HOOK_WITH(CALLER, MISSING, ...) names the caller and that code.
#define LP_PARAM(type, name) type name
#define LP_ARG(type, name) name
#define LP_TYPE(type, name) type
#define LP_MAP1(m, x) m x
#define LP_MAP2(m, x, ...) m x, LP_MAP1(m, __VA_ARGS__)
#define LP_MAP3(m, x, ...) m x, LP_MAP2(m, __VA_ARGS__)
#define LP_MAP4(m, x, ...) m x, LP_MAP3(m, __VA_ARGS__)
#define LP_MAP5(m, x, ...) m x, LP_MAP4(m, __VA_ARGS__)
#define LP_MAP6(m, x, ...) m x, LP_MAP5(m, __VA_ARGS__)
#define LP_MAP7(m, x, ...) m x, LP_MAP6(m, __VA_ARGS__)
#define LP_MAP8(m, x, ...) m x, LP_MAP7(m, __VA_ARGS__)
#define LP_MAP9(m, x, ...) m x, LP_MAP8(m, __VA_ARGS__)
#define LP_PICK(_1, _2, _3, _4, _5, _6, _7, _8, _9, NAME, ...) NAME
#define LP_MAP(m, ...)                                                                  \
  LP_PICK(__VA_ARGS__, LP_MAP9, LP_MAP8, LP_MAP7, LP_MAP6, LP_MAP5, LP_MAP4, LP_MAP3, \
          LP_MAP2, LP_MAP1)(m, __VA_ARGS__)

#define HOOK_WITH(CALLER, MISSING, NAME, RET, RESOLVE, ...)                                      \
  using Fn_##NAME = RET (*)(LP_MAP(LP_TYPE, __VA_ARGS__));                              \
  static real::Lazy<Fn_##NAME> slot_##NAME[kViaCount];                                        \
  template <Via V>                                                                      \
  RET Body_##NAME(Fn_##NAME real, Caller caller, LP_MAP(LP_PARAM, __VA_ARGS__));        \
  template <Via V>                                                                      \
  RET Enter_##NAME(Caller caller, LP_MAP(LP_PARAM, __VA_ARGS__)) {                      \
    Fn_##NAME real = slot_##NAME[static_cast<int>(V)].Get(&RESOLVE, #NAME);             \
    if (real == nullptr) return static_cast<RET>(MISSING);                              \
    return Body_##NAME<V>(real, caller, LP_MAP(LP_ARG, __VA_ARGS__));                   \
  }                                                                                     \
  template <Via V>                                                                      \
  RET Hook_##NAME(LP_MAP(LP_PARAM, __VA_ARGS__)) {                                      \
    return Enter_##NAME<V>(CALLER, LP_MAP(LP_ARG, __VA_ARGS__));                        \
  }                                                                                     \
  LAZYPIN_EXPORT RET NAME(LP_MAP(LP_PARAM, __VA_ARGS__)) {                              \
    return Enter_##NAME<Via::kSymbol>(CALLER, LP_MAP(LP_ARG, __VA_ARGS__));             \
  }                                                                                     \
  static void* HookOf_##NAME(Via via) {                                                  \
    switch (via) {                                                                      \
      case Via::kSymbol: return reinterpret_cast<void*>(&Hook_##NAME<Via::kSymbol>);    \
      case Via::kDlsym: return reinterpret_cast<void*>(&Hook_##NAME<Via::kDlsym>);      \
      case Via::kGetProc: return reinterpret_cast<void*>(&Hook_##NAME<Via::kGetProc>);  \
    }                                                                                   \
    return nullptr;                                                                     \
  }                                                                                     \
  static bool OfferReal_##NAME(Via via, void* fn) {                                     \
    return via != Via::kSymbol && slot_##NAME[static_cast<int>(via)].Offer(fn);         \
  }                                                                                     \
  template <Via V>                                                                      \
  RET Body_##NAME(Fn_##NAME real, [[maybe_unused]] Caller caller, LP_MAP(LP_PARAM, __VA_ARGS__))
#define HOOK(...) HOOK_WITH(Caller{}, CUDA_ERROR_NOT_INITIALIZED, __VA_ARGS__)
#define RECORDED_HOOK(...) HOOK_WITH(LAZYPIN_CALLER(), CUDA_ERROR_NOT_INITIALIZED, __VA_ARGS__)

// A table's rows: ENTRY for one entry point; COPY_ENTRIES and
// SYNC_COPY_ENTRIES for a copy and its per-thread-stream twin (cuda.h's
// versions); RUNTIME_ENTRY for a runtime hook (hooks_runtime.cc).
#define ENTRY_FOR(NAME, PROC, MIN, MAX, STREAM) \
  {#NAME, PROC, MIN, MAX, HookEntry::Stream::STREAM, &HookOf_##NAME, &OfferReal_##NAME}
#define ENTRY(NAME, PROC, MIN, MAX) ENTRY_FOR(NAME, PROC, MIN, MAX, kAny)
// A copy's legacy entry point and its per-thread-stream twin (cuda.h's versions).
#define COPY_ENTRIES(NAME, PROC, MIN)                   \
  ENTRY_FOR(NAME, PROC, MIN, INT_MAX, kLegacy),         \
  ENTRY_FOR(NAME##_ptsz, PROC, 7000, INT_MAX, kPerThread)
#define SYNC_COPY_ENTRIES(NAME, PROC, MIN)              \
  ENTRY_FOR(NAME, PROC, MIN, INT_MAX, kLegacy),         \
  ENTRY_FOR(NAME##_ptds, PROC, 7000, INT_MAX, kPerThread)
// A runtime hook: found by dlsym only (no getter name, no version).
#define RUNTIME_ENTRY(NAME) \
  {#NAME, nullptr, 0, -1, HookEntry::Stream::kAny, &HookOf_##NAME, &OfferReal_##NAME}

// HOOK_TABLE(FN, rows...): a file's table, and FN() that returns it.
#define HOOK_TABLE(FN, ...)                                                      \
  namespace lazypin {                                                            \
  namespace {                                                                    \
  const HookEntry kTable_##FN[] = {__VA_ARGS__};                                 \
  }                                                                              \
  HookTable FN() { return {kTable_##FN, sizeof kTable_##FN / sizeof kTable_##FN[0]}; } \
  }
