// hooks_driver: the driver API hooks, and the two doors into them that do not
// go through symbol interposition: our `dlsym` (a program, ctypes or cudart
// asking a library handle for a function) and our wrappers of
// `cuGetProcAddress(_v2)` (static cudart, CuPy, cuda-python: every driver
// entry point comes from the getter). Each hook exists in three copies, one
// per door (Via), each with its own real function, so the log says how the
// program reached it and no door's real function is mistaken for another's.
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include <stdlib.h>

#include <atomic>
#include <climits>

// Every versioned name (cuMemHostRegister and cuMemHostRegister_v2 alike)
// must stay itself here, not be renamed by cuda.h's #defines.
#define __CUDA_API_VERSION_INTERNAL 1
#include "auto_pin.h"
#include "capture.h"
#include "cuda.h"
#include "dispatch.h"
#include "driver_calls.h"
#include "graph_ranges.h"
#include "hooks.h"
#include "own_memory.h"
#include "pages.h"
#include "real.h"
#include "export.h"
#include "state.h"
#include "sys.h"
#include "thread_state.h"

namespace lazypin {
namespace {

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

void* DriverSymbol(const char* name) {
  if (void* fn = real::Next(name)) return fn;
  return real::Driver(name);
}

bool IsOurs(void* fn) {
  static void* const self_base = [] {
    Dl_info info;
    return dladdr(reinterpret_cast<void*>(&DriverSymbol), &info) ? info.dli_fbase : nullptr;
  }();
  Dl_info info;
  return fn != nullptr && dladdr(fn, &info) != 0 && info.dli_fbase == self_base;
}

}  // namespace
}  // namespace lazypin

using namespace lazypin;  // NOLINT: the hooks below are C symbols

// HOOK(NAME, RET, RESOLVE, (T1, a1), (T2, a2), ...) { body using `real`, `V` and a1... }
// defines the three copies Hook_NAME<Via>, each with its own real-function slot
// (resolved by RESOLVE for the symbol door, offered by dlsym or the getter for
// the others), and exports NAME itself. Each parameter is written once.
// RECORDED_HOOK: the same for a call the log records, whose body also has
// `caller` (dispatch.h's Caller), taken in Hook_NAME and in NAME, the
// functions the program calls; HOOK's `caller` is empty (no frame pointer forced).
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

#define HOOK_WITH(CALLER, NAME, RET, RESOLVE, ...)                                      \
  using Fn_##NAME = RET (*)(LP_MAP(LP_TYPE, __VA_ARGS__));                              \
  static real::Lazy<Fn_##NAME> slot_##NAME[kViaCount];                                        \
  template <Via V>                                                                      \
  RET Body_##NAME(Fn_##NAME real, Caller caller, LP_MAP(LP_PARAM, __VA_ARGS__));        \
  template <Via V>                                                                      \
  RET Enter_##NAME(Caller caller, LP_MAP(LP_PARAM, __VA_ARGS__)) {                      \
    Fn_##NAME real = slot_##NAME[static_cast<int>(V)].Get(&RESOLVE, #NAME);             \
    if (real == nullptr) return static_cast<RET>(CUDA_ERROR_NOT_INITIALIZED);           \
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
#define HOOK(...) HOOK_WITH(Caller{}, __VA_ARGS__)
#define RECORDED_HOOK(...) HOOK_WITH(LAZYPIN_CALLER(), __VA_ARGS__)

// The dispatch when lazypin is active and this is not lazypin's own call; else null.
static Dispatch* ActiveDispatch() { return t_state.inside ? nullptr : ActiveState()->dispatch; }
// The same without setting lazypin up (teardown and queries need no set-up).
static Dispatch* PublishedDispatch() {
  const ShimState* state = t_state.inside ? nullptr : StateInThisProcess();
  return state != nullptr ? state->dispatch : nullptr;
}

// ---- registration ----------------------------------------------------------
RECORDED_HOOK(cuMemHostRegister, CUresult, DriverSymbol, (void*, p), (size_t, bytes), (unsigned int, flags)) {
  Dispatch* dispatch = ActiveDispatch();
  if (dispatch == nullptr) return real(p, bytes, flags);
  return static_cast<CUresult>(dispatch->Driver({Api::kCuMemHostRegister, V, p, bytes, flags, caller},
                                                [&] { return int{real(p, bytes, flags)}; }));
}

RECORDED_HOOK(cuMemHostRegister_v2, CUresult, DriverSymbol, (void*, p), (size_t, bytes),
     (unsigned int, flags)) {
  Dispatch* dispatch = ActiveDispatch();
  if (dispatch == nullptr) return real(p, bytes, flags);
  return static_cast<CUresult>(dispatch->Driver({Api::kCuMemHostRegisterV2, V, p, bytes, flags, caller},
                                                [&] { return int{real(p, bytes, flags)}; }));
}

RECORDED_HOOK(cuMemHostUnregister, CUresult, DriverSymbol, (void*, p)) {
  Dispatch* dispatch = ActiveDispatch();
  if (dispatch == nullptr) return real(p);
  return static_cast<CUresult>(
      dispatch->Driver({Api::kCuMemHostUnregister, V, p, 0, 0, caller}, [&] { return int{real(p)}; }));
}

// ---- pinned host allocations: the host-allocation cache (host_alloc_cache.h)
#define HOST_ALLOC_HOOK(NAME, API, SIZE_TYPE)                                               \
  RECORDED_HOOK(NAME, CUresult, DriverSymbol, (void**, pp), (SIZE_TYPE, bytes)) {           \
    Dispatch* dispatch = ActiveDispatch();                                                  \
    if (dispatch == nullptr) return real(pp, bytes);                                        \
    return static_cast<CUresult>(dispatch->HostDriver({API, V, nullptr, bytes, 0, caller}, pp, \
                                                      [&] { return int{real(pp, bytes)}; })); \
  }
HOST_ALLOC_HOOK(cuMemAllocHost, Api::kCuMemAllocHost, unsigned int)
HOST_ALLOC_HOOK(cuMemAllocHost_v2, Api::kCuMemAllocHostV2, size_t)

RECORDED_HOOK(cuMemHostAlloc, CUresult, DriverSymbol, (void**, pp), (size_t, bytes), (unsigned int, flags)) {
  Dispatch* dispatch = ActiveDispatch();
  if (dispatch == nullptr) return real(pp, bytes, flags);
  return static_cast<CUresult>(dispatch->HostDriver({Api::kCuMemHostAlloc, V, nullptr, bytes, flags, caller},
                                                    pp, [&] { return int{real(pp, bytes, flags)}; }));
}

RECORDED_HOOK(cuMemFreeHost, CUresult, DriverSymbol, (void*, p)) {
  Dispatch* dispatch = ActiveDispatch();
  if (dispatch == nullptr) return real(p);
  return static_cast<CUresult>(
      dispatch->HostDriver({Api::kCuMemFreeHost, V, p, 0, 0, caller}, nullptr, [&] { return int{real(p)}; }));
}

// ---- context teardown: the driver drops that context's registrations --------
#define CONTEXT_HOOK(NAME, PARAM_TYPE, ACTION)                        \
  HOOK(NAME, CUresult, DriverSymbol, (PARAM_TYPE, arg)) {             \
    if (Dispatch* dispatch = PublishedDispatch()) dispatch->ACTION;   \
    return real(arg);                                                 \
  }
CONTEXT_HOOK(cuCtxDestroy, CUcontext, BeforeContextDestroy(arg))
CONTEXT_HOOK(cuCtxDestroy_v2, CUcontext, BeforeContextDestroy(arg))
CONTEXT_HOOK(cuDevicePrimaryCtxReset, CUdevice, BeforePrimaryContextReset(arg, true))
CONTEXT_HOOK(cuDevicePrimaryCtxReset_v2, CUdevice, BeforePrimaryContextReset(arg, true))
// A release to 0 destroys the primary context, and the driver its registrations.
#define RELEASE_HOOK(NAME)                                                     \
  HOOK(NAME, CUresult, DriverSymbol, (CUdevice, device)) {                     \
    Dispatch* dispatch = PublishedDispatch();                                  \
    const Context primary = dispatch != nullptr                                \
        ? dispatch->BeforePrimaryContextReset(device, false) : nullptr;         \
    const CUresult result = real(device);                                      \
    if (dispatch != nullptr && result == CUDA_SUCCESS) {                       \
      dispatch->AfterPrimaryContextRelease(device, primary);                   \
    }                                                                          \
    return result;                                                             \
  }
RELEASE_HOOK(cuDevicePrimaryCtxRelease)
RELEASE_HOOK(cuDevicePrimaryCtxRelease_v2)

namespace lazypin {
namespace {
// The capture recording work on `stream` now (its tracker key), or 0: none,
// or unknown. One relaxed load when nothing captures. (Defined with the
// capture hooks below.)
uint64_t RecordingCapture(CUstream stream);
}  // namespace
}  // namespace lazypin

// ---- async copies: memory the program unregistered copies as pageable -------
// After the real call: the copy's host ranges (a side that is host or
// unified memory) go to Dispatch::AfterAsyncCopy, which synchronizes the
// stream if the program has unregistered that memory (pool.h: deferred).
// Before the real call of a copy that a capture records, the same ranges go
// to the capture's graph (graph_ranges.h), called with `kRecordedCopy`.
namespace {
uintptr_t HostAddr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// Not a driver result: AFTER(stream) for a copy a capture is about to record.
constexpr CUresult kRecordedCopy = static_cast<CUresult>(-1);

// The dispatch when lazypin defers (graph ranges matter only then).
Dispatch* DeferringDispatch() {
  Dispatch* dispatch = PublishedDispatch();
  return dispatch != nullptr && dispatch->pool() != nullptr ? dispatch : nullptr;
}

// A memcpy node of `owner` (a graph or an executable graph; null: unknown)
// names host memory [lo, hi): noted, and deferred entries there released.
void NoteGraphRange(Dispatch* dispatch, const void* owner, uintptr_t lo, uintptr_t hi) {
  if (hi <= lo) return;
  {
    ScopedInsideLazypin inside;
    if (owner != nullptr) {
      Graphs().Add(owner, {lo, hi});
    } else {
      Graphs().AddStray({lo, hi});
    }
  }
  dispatch->BeforeGraphUse(lo, hi);
}

void AfterCopy(CUresult result, uintptr_t lo, size_t bytes, CUstream stream) {
  if (bytes == 0 || t_state.inside) return;
  if (result == kRecordedCopy) {
    // Recorded, not run: the graph replays it at each launch (released then
    // too), and the driver records it as the program's memory is now.
    const uint64_t capture = RecordingCapture(stream);
    Dispatch* dispatch = DeferringDispatch();
    if (capture == 0 || dispatch == nullptr) return;
    {
      ScopedInsideLazypin inside;
      Graphs().AddToCapture(capture, {lo, RangeEnd(lo, bytes)});
    }
    dispatch->BeforeGraphUse(lo, RangeEnd(lo, bytes));
    return;
  }
  if (result != CUDA_SUCCESS) return;
  if (Dispatch* dispatch = PublishedDispatch()) {
    dispatch->AfterAsyncCopy(lo, RangeEnd(lo, bytes), stream);
  }
}

void AfterSides(CUresult result, const CopySide& dst, const CopySide& src, CUstream stream) {
  AfterCopy(result, src.lo, src.bytes, stream);
  AfterCopy(result, dst.lo, dst.bytes, stream);
}

void AfterCopy2D(CUresult result, const CUDA_MEMCPY2D* c, CUstream stream) {
  CopySide dst, src;
  if ((result != CUDA_SUCCESS && result != kRecordedCopy) || !Sides2D(c, &dst, &src)) return;
  AfterSides(result, dst, src, stream);
}

// CUDA_MEMCPY3D, or CUDA_MEMCPY3D_PEER (the same fields, each side with a context).
template <typename Copy3D>
void AfterCopy3D(CUresult result, const Copy3D* c, CUstream stream) {
  CopySide dst, src;
  if ((result != CUDA_SUCCESS && result != kRecordedCopy) || !Sides3D(c, &dst, &src)) return;
  AfterSides(result, dst, src, stream);
}

// A `_ptsz` function's null stream is the calling thread's per-thread stream.
CUstream PerThread(CUstream stream) { return stream == nullptr ? CU_STREAM_PER_THREAD : stream; }

// ---- auto-pin (LAZYPIN_AUTOPIN, auto_pin.h): before the real copy ----------
// The copy's host sides, as AutoPin::BeforeCopy takes them. With
// LAZYPIN_AUTOPIN asked for, a copy of kAutoPinFloor bytes or more sets
// lazypin up (a program may copy long before, or without, any register);
// smaller ones cost one comparison.
AutoPin* AutoPinFor(size_t bytes) {
  if (bytes < kAutoPinFloor || t_state.inside) return nullptr;
  static const bool requested =
      PeekConfig([](const char* name) { return getenv(name); }, {"LAZYPIN_AUTOPIN"}).autopin;
  if (!requested) return nullptr;
  const ShimState* state = ActiveState();
  return state != nullptr ? state->auto_pin : nullptr;
}

// Before any copy that may move host memory [lo, lo + bytes): the kernel
// watch's changes there are applied first, and what lazypin keeps that the
// copy covers in part is released (Dispatch::BeforeCopy). With nothing
// deferred: one relaxed load past the published state.
void GuardCopySide(uintptr_t lo, size_t bytes) {
  if (bytes == 0) return;
  const uintptr_t hi = RangeEnd(lo, bytes);
  const ShimState* state = PublishedState();
  if (state == nullptr || state->dispatch == nullptr ||
      !state->dispatch->MayCopyThroughDeferred(lo, hi) || t_state.inside) {
    return;
  }
  // A copy of the process that fork's handlers missed switches first.
  if (Dispatch* dispatch = PublishedDispatch()) dispatch->BeforeCopy(lo, hi);
}

// What the copy is to auto-pin (AutoPinCopy: rate kNone without auto-pin, or
// for a copy it did not class): a synchronous hook times the real copy with
// TimedCopy where the rate is set, else tail-calls it.
AutoPinCopy BeforeCopy(const char* api, Via via, CopySide dst, CopySide src) {
  GuardCopySide(dst.lo, dst.bytes);
  GuardCopySide(src.lo, src.bytes);
  if (AutoPin* auto_pin = AutoPinFor(dst.bytes > src.bytes ? dst.bytes : src.bytes)) {
    return auto_pin->BeforeCopy(api, via, dst, src);
  }
  return AutoPinCopy{};
}

AutoPinCopy BeforeCopy2D(const char* api, Via via, const CUDA_MEMCPY2D* c) {
  CopySide dst, src;
  return Sides2D(c, &dst, &src) ? BeforeCopy(api, via, dst, src) : AutoPinCopy{};
}

AutoPinCopy BeforeCopy3D(const char* api, Via via, const CUDA_MEMCPY3D* c) {
  CopySide dst, src;
  return Sides3D(c, &dst, &src) ? BeforeCopy(api, via, dst, src) : AutoPinCopy{};
}

// The real synchronous copy `real`, which auto-pin classed `copy`, called
// with the hook's arguments: its time goes to AutoPin (the rates that price
// auto-pin's saving). Out of line, so that the hooks' untimed path stays a
// test and a tail call.
template <typename Real>
struct TimedCopy {
  AutoPinCopy copy;
  Real real;
  template <typename... Args>
  __attribute__((noinline)) CUresult operator()(Args... args) const {
    const int64_t t0 = MonotonicNs();
    const CUresult result = real(args...);
    if (result == CUDA_SUCCESS) {
      if (AutoPin* auto_pin = AutoPinFor(copy.bytes)) auto_pin->CopyTimed(copy, MonotonicNs() - t0);
    }
    return result;
  }
};
template <typename Real>
TimedCopy<Real> Timed(const AutoPinCopy& copy, Real real) {
  return TimedCopy<Real>{copy, real};
}

// Copies auto-pin does not cover (docs/design.md, "Auto-pin"): only the watch's
// changes are applied first.
void GuardCopy3DPeer(const CUDA_MEMCPY3D_PEER* c) {
  CopySide dst, src;
  if (!Sides3D(c, &dst, &src)) return;
  GuardCopySide(dst.lo, dst.bytes);
  GuardCopySide(src.lo, src.bytes);
}

// cuMemcpyBatchAsync: `count` unified copies.
void GuardBatch(const CUdeviceptr* dsts, const CUdeviceptr* srcs, const size_t* sizes,
                size_t count) {
  if (dsts == nullptr || srcs == nullptr || sizes == nullptr) return;
  for (size_t i = 0; i < count; ++i) {
    GuardCopySide(srcs[i], sizes[i]);
    GuardCopySide(dsts[i], sizes[i]);
  }
}
void AfterBatch(CUresult result, const CUdeviceptr* dsts, const CUdeviceptr* srcs,
                const size_t* sizes, size_t count, CUstream stream) {
  if ((result != CUDA_SUCCESS && result != kRecordedCopy) || dsts == nullptr || srcs == nullptr ||
      sizes == nullptr) {
    return;
  }
  for (size_t i = 0; i < count; ++i) {
    AfterCopy(result, srcs[i], sizes[i], stream);
    AfterCopy(result, dsts[i], sizes[i], stream);
  }
}

void GuardBatch3D(size_t count, const CUDA_MEMCPY3D_BATCH_OP* ops) {
  if (ops == nullptr) return;
  for (size_t i = 0; i < count; ++i) {
    const CopySide src = OperandSide(ops[i].src, ops[i].extent);
    const CopySide dst = OperandSide(ops[i].dst, ops[i].extent);
    GuardCopySide(src.lo, src.bytes);
    GuardCopySide(dst.lo, dst.bytes);
  }
}
void AfterBatch3D(CUresult result, size_t count, const CUDA_MEMCPY3D_BATCH_OP* ops,
                  CUstream stream) {
  if ((result != CUDA_SUCCESS && result != kRecordedCopy) || ops == nullptr) return;
  for (size_t i = 0; i < count; ++i) {
    const CopySide src = OperandSide(ops[i].src, ops[i].extent);
    const CopySide dst = OperandSide(ops[i].dst, ops[i].extent);
    AfterCopy(result, src.lo, src.bytes, stream);
    AfterCopy(result, dst.lo, dst.bytes, stream);
  }
}

// ---- async host-to-device copies from memory the program unregistered ------
// A pageable source is taken as of the call, without waiting for the stream:
// the copy and the stream's earlier work may still be pending on return (a
// stream may wait on the program's own later action). Memory the program
// unregistered that lazypin holds registered would be copied as pinned,
// later, and synchronizing the stream instead waits for that earlier work.
// On a stream with work in flight (Dispatch::StreamIdle false, or unknown),
// the 1D forms read such a source now into lazypin's own pageable scratch
// (ReadOwnMemory: a source that cannot be read is no fault) and issue the real
// copy from there, in chunks of kStageChunk bytes: each is a pageable copy,
// staged by the driver when it returns, so the scratch may then be reused.
// The scratch is the thread's own, mapped at its first staged copy and kept
// until the thread ends (a fresh mapping per copy cost 4x more in page faults).
// Where no scratch can be had, or the source cannot be read, the rest is
// issued as the program asked and its stream synchronized (AfterCopy). On an
// idle stream the copy runs as asked (pinned: the fast path auto-pin is for)
// and the synchronize after it waits for that copy alone. While a capture is
// in progress nothing is staged (a recorded copy would name the scratch):
// the copy runs as asked, and a stream that is not capturing is synchronized.
constexpr size_t kStageChunk = size_t{1} << 20;

// This thread's scratch: trivially destructible, so that it can be read to
// the thread's very end; ScratchOwner's destructor (thread exit, exit())
// unmaps it and clears it. Program code that runs after that (its own
// thread_local destructors, pthread key destructors, atexit handlers) finds
// no scratch and copies as it asked.
struct ScratchSlot {
  void* p = nullptr;
  bool tried = false;
};
thread_local ScratchSlot t_scratch;
struct ScratchOwner {
  ~ScratchOwner() {
    UnmapScratch(t_scratch.p, kStageChunk);
    t_scratch.p = nullptr;
  }
};

// This thread's scratch (kStageChunk bytes), or null where none can be had.
void* ThreadScratch(Dispatch* dispatch) {
  if (!t_scratch.tried) {
    t_scratch.tried = true;
    void* p = MapScratch(kStageChunk);
    if (p == nullptr) return nullptr;
    // Fresh memory the pool cannot hold, unless the kernel watch has yet to
    // report that the program unmapped a deferred range there.
    const uintptr_t lo = HostAddr(p);
    dispatch->BeforeCopy(lo, RangeEnd(lo, kStageChunk));
    if (dispatch->CopiesFromDeferred(lo, RangeEnd(lo, kStageChunk))) {
      UnmapScratch(p, kStageChunk);
      return nullptr;
    }
    static thread_local ScratchOwner owner;
    (void)owner;
    t_scratch.p = p;
  }
  return t_scratch.p;
}

// The dispatch where the source [src, src + bytes) of an async host-to-device
// copy overlaps memory the program unregistered; else null. One relaxed load
// past the published state when nothing is deferred.
Dispatch* StagingDispatch(uintptr_t src, size_t bytes) {
  if (bytes == 0 || t_state.inside) return nullptr;
  const ShimState* state = PublishedState();
  if (state == nullptr || state->dispatch == nullptr ||
      !state->dispatch->MayCopyThroughDeferred(src, RangeEnd(src, bytes))) {
    return nullptr;
  }
  Dispatch* dispatch = PublishedDispatch();
  return dispatch != nullptr && dispatch->CopiesFromDeferred(src, RangeEnd(src, bytes)) ? dispatch
                                                                                         : nullptr;
}

// Whether the driver takes a copy of `bytes` to `dst` as a whole: the device
// allocation holding dst holds all of it. Else the copy is not staged, and
// the driver refuses it before a byte moves, as without lazypin.
bool DestinationHolds(CUdeviceptr dst, size_t bytes) {
  auto range = driver::MemGetAddressRange();
  CUdeviceptr base = 0;
  size_t size = 0;
  return range != nullptr && range(&base, &size, dst) == CUDA_SUCCESS && dst >= base &&
         bytes <= size - (dst - base);
}

// The copy of `bytes` from host `src` to `dst` on `stream` (the resolved one,
// for the fallback's synchronize), through scratch; `issue(dst, src, n)` is
// the real copy. The first failure is returned, as the driver gave it.
template <typename Issue>
CUresult StagedHtoD(Dispatch* dispatch, CUdeviceptr dst, uintptr_t src, size_t bytes,
                    CUstream stream, Issue issue) {
  void* scratch = ThreadScratch(dispatch);
  size_t done = 0;
  CUresult result = CUDA_SUCCESS;
  while (scratch != nullptr && done < bytes) {
    const size_t n = bytes - done < kStageChunk ? bytes - done : kStageChunk;
    if (!ReadOwnMemory(scratch, reinterpret_cast<const void*>(src + done), n)) break;
    result = issue(dst + done, HostAddr(scratch), n);
    if (result != CUDA_SUCCESS) break;
    done += n;
  }
  if (done == bytes || result != CUDA_SUCCESS) return result;
  result = issue(dst + done, src + done, bytes - done);
  AfterCopy(result, src + done, bytes - done, stream);
  return result;
}
}  // namespace

// The 1D async host-to-device forms, twice (legacy stream, `_ptsz`): as
// COPY_HOOKS, but a source the program unregistered is staged (StagedHtoD).
// An auto-pinned source is deferred too, so it is staged as well.
#define STAGED_COPY_HOOK(NAME, HOOKED, S)                                                \
  HOOK(HOOKED, CUresult, DriverSymbol, COPY_PARAMS_##NAME) {                             \
    CUresult result = kRecordedCopy;                                                     \
    if (RecordingCapture(S) != 0) AFTER_STAGED_##NAME(S);                                \
    BEFORE_STAGED_##NAME(#HOOKED);                                                       \
    Dispatch* dispatch = StagingDispatch(uintptr_t(src), bytes);                         \
    if (dispatch != nullptr && !Captures().Any() && !dispatch->StreamIdle(S) &&          \
        DestinationHolds(dst, bytes)) {                                                  \
      result = StagedHtoD(dispatch, dst, uintptr_t(src), bytes, S,                       \
                          [&](CUdeviceptr d, uintptr_t from, size_t n) {                 \
                            return real(d, (decltype(src))(from), n, stream);            \
                          });                                                            \
      AFTER_DST_##NAME(S);                                                               \
      return result;                                                                     \
    }                                                                                    \
    result = real COPY_ARGS_##NAME;                                                      \
    AFTER_STAGED_##NAME(S);                                                              \
    return result;                                                                       \
  }
#define STAGED_COPY_HOOKS(NAME)          \
  STAGED_COPY_HOOK(NAME, NAME, stream) \
  STAGED_COPY_HOOK(NAME, NAME##_ptsz, PerThread(stream))

// Each copy twice: the legacy-stream entry point and its `_ptsz` twin.
// BEFORE(api) may auto-pin the host side; AFTER(stream) keeps pageable
// semantics, and first, for a copy that a capture records, notes its ranges.
#define COPY_HOOKS(NAME, BEFORE, AFTER)                                                  \
  HOOK(NAME, CUresult, DriverSymbol, COPY_PARAMS_##NAME) {                               \
    CUresult result = kRecordedCopy;                                                     \
    if (RecordingCapture(stream) != 0) AFTER(stream);                                    \
    BEFORE(#NAME);                                                                       \
    result = real COPY_ARGS_##NAME;                                                      \
    AFTER(stream);                                                                       \
    return result;                                                                       \
  }                                                                                      \
  HOOK(NAME##_ptsz, CUresult, DriverSymbol, COPY_PARAMS_##NAME) {                        \
    CUresult result = kRecordedCopy;                                                     \
    if (RecordingCapture(PerThread(stream)) != 0) AFTER(PerThread(stream));              \
    BEFORE(#NAME "_ptsz");                                                               \
    result = real COPY_ARGS_##NAME;                                                      \
    AFTER(PerThread(stream));                                                            \
    return result;                                                                       \
  }
// Synchronous copies, and their `_ptds` twins (per-thread default stream):
// complete on return whether pinned or not, so only BEFORE.
#define SYNC_COPY_HOOKS(NAME, BEFORE)                                                    \
  HOOK(NAME, CUresult, DriverSymbol, COPY_PARAMS_##NAME) {                               \
    BEFORE(#NAME);                                                                       \
    return real COPY_ARGS_##NAME;                                                        \
  }                                                                                      \
  HOOK(NAME##_ptds, CUresult, DriverSymbol, COPY_PARAMS_##NAME) {                        \
    BEFORE(#NAME "_ptds");                                                               \
    return real COPY_ARGS_##NAME;                                                        \
  }
// Synchronous copies auto-pin looks at: the same, and the copy timed where
// auto-pin classed it (TimedCopy; async copies return before their bytes
// move, so they are never timed).
#define TIMED_SYNC_COPY_HOOKS(NAME, BEFORE)                                              \
  HOOK(NAME, CUresult, DriverSymbol, COPY_PARAMS_##NAME) {                               \
    const AutoPinCopy timed = BEFORE(#NAME);                                             \
    if (timed.rate == CopyRate::kNone) return real COPY_ARGS_##NAME;                     \
    return Timed(timed, real) COPY_ARGS_##NAME;                                          \
  }                                                                                      \
  HOOK(NAME##_ptds, CUresult, DriverSymbol, COPY_PARAMS_##NAME) {                        \
    const AutoPinCopy timed = BEFORE(#NAME "_ptds");                                     \
    if (timed.rate == CopyRate::kNone) return real COPY_ARGS_##NAME;                     \
    return Timed(timed, real) COPY_ARGS_##NAME;                                          \
  }
#define COPY_PARAMS_cuMemcpyHtoDAsync_v2 \
  (CUdeviceptr, dst), (const void*, src), (size_t, bytes), (CUstream, stream)
#define COPY_ARGS_cuMemcpyHtoDAsync_v2 (dst, src, bytes, stream)
#define COPY_PARAMS_cuMemcpyDtoHAsync_v2 \
  (void*, dst), (CUdeviceptr, src), (size_t, bytes), (CUstream, stream)
#define COPY_ARGS_cuMemcpyDtoHAsync_v2 (dst, src, bytes, stream)
#define COPY_PARAMS_cuMemcpyAsync \
  (CUdeviceptr, dst), (CUdeviceptr, src), (size_t, bytes), (CUstream, stream)
#define COPY_ARGS_cuMemcpyAsync (dst, src, bytes, stream)
#define COPY_PARAMS_cuMemcpy2DAsync_v2 (const CUDA_MEMCPY2D*, copy), (CUstream, stream)
#define COPY_ARGS_cuMemcpy2DAsync_v2 (copy, stream)
#define COPY_PARAMS_cuMemcpy3DAsync_v2 (const CUDA_MEMCPY3D*, copy), (CUstream, stream)
#define COPY_ARGS_cuMemcpy3DAsync_v2 (copy, stream)
#define COPY_PARAMS_cuMemcpyHtoD_v2 (CUdeviceptr, dst), (const void*, src), (size_t, bytes)
#define COPY_ARGS_cuMemcpyHtoD_v2 (dst, src, bytes)
#define COPY_PARAMS_cuMemcpyDtoH_v2 (void*, dst), (CUdeviceptr, src), (size_t, bytes)
#define COPY_ARGS_cuMemcpyDtoH_v2 (dst, src, bytes)
#define COPY_PARAMS_cuMemcpy (CUdeviceptr, dst), (CUdeviceptr, src), (size_t, bytes)
#define COPY_ARGS_cuMemcpy (dst, src, bytes)
#define COPY_PARAMS_cuMemcpy2D_v2 (const CUDA_MEMCPY2D*, copy)
#define COPY_ARGS_cuMemcpy2D_v2 (copy)
#define COPY_PARAMS_cuMemcpy2DUnaligned_v2 (const CUDA_MEMCPY2D*, copy)
#define COPY_ARGS_cuMemcpy2DUnaligned_v2 (copy)
#define COPY_PARAMS_cuMemcpy3D_v2 (const CUDA_MEMCPY3D*, copy)
#define COPY_ARGS_cuMemcpy3D_v2 (copy)

#define BEFORE_HTOD(api) BeforeCopy(api, V, CopySide{}, HostSide(src, bytes))
#define BEFORE_DTOH(api) BeforeCopy(api, V, HostSide(dst, bytes), CopySide{})
#define BEFORE_ANY(api) BeforeCopy(api, V, UnifiedSide(dst, bytes), UnifiedSide(src, bytes))
#define BEFORE_2D(api) BeforeCopy2D(api, V, copy)
#define BEFORE_3D(api) BeforeCopy3D(api, V, copy)
#define AFTER_HTOD(s) AfterCopy(result, HostAddr(src), bytes, s)
#define AFTER_DTOH(s) AfterCopy(result, HostAddr(dst), bytes, s)
// Unified addressing: either side may be host memory.
#define AFTER_ANY(s) (AfterCopy(result, src, bytes, s), AfterCopy(result, dst, bytes, s))
#define AFTER_2D(s) AfterCopy2D(result, copy, s)
#define AFTER_3D(s) AfterCopy3D(result, copy, s)
#define BEFORE_STAGED_cuMemcpyHtoDAsync_v2 BEFORE_HTOD
#define AFTER_STAGED_cuMemcpyHtoDAsync_v2 AFTER_HTOD
#define AFTER_DST_cuMemcpyHtoDAsync_v2(s)
#define BEFORE_STAGED_cuMemcpyAsync BEFORE_ANY
#define AFTER_STAGED_cuMemcpyAsync AFTER_ANY
#define AFTER_DST_cuMemcpyAsync(s) AfterCopy(result, dst, bytes, s)
STAGED_COPY_HOOKS(cuMemcpyHtoDAsync_v2)
COPY_HOOKS(cuMemcpyDtoHAsync_v2, BEFORE_DTOH, AFTER_DTOH)
STAGED_COPY_HOOKS(cuMemcpyAsync)
COPY_HOOKS(cuMemcpy2DAsync_v2, BEFORE_2D, AFTER_2D)
COPY_HOOKS(cuMemcpy3DAsync_v2, BEFORE_3D, AFTER_3D)
TIMED_SYNC_COPY_HOOKS(cuMemcpyHtoD_v2, BEFORE_HTOD)
TIMED_SYNC_COPY_HOOKS(cuMemcpyDtoH_v2, BEFORE_DTOH)
TIMED_SYNC_COPY_HOOKS(cuMemcpy, BEFORE_ANY)
TIMED_SYNC_COPY_HOOKS(cuMemcpy2D_v2, BEFORE_2D)
TIMED_SYNC_COPY_HOOKS(cuMemcpy2DUnaligned_v2, BEFORE_2D)
TIMED_SYNC_COPY_HOOKS(cuMemcpy3D_v2, BEFORE_3D)

// Copies auto-pin leaves alone: arrays, peer 3D, batches. Only the watch's
// changes are applied first, and the async ones keep pageable semantics.
#define COPY_PARAMS_cuMemcpyHtoA_v2 (CUarray, dst), (size_t, offset), (const void*, src), (size_t, bytes)
#define COPY_ARGS_cuMemcpyHtoA_v2 (dst, offset, src, bytes)
#define COPY_PARAMS_cuMemcpyAtoH_v2 (void*, dst), (CUarray, src), (size_t, offset), (size_t, bytes)
#define COPY_ARGS_cuMemcpyAtoH_v2 (dst, src, offset, bytes)
#define COPY_PARAMS_cuMemcpyHtoAAsync_v2 \
  (CUarray, dst), (size_t, offset), (const void*, src), (size_t, bytes), (CUstream, stream)
#define COPY_ARGS_cuMemcpyHtoAAsync_v2 (dst, offset, src, bytes, stream)
#define COPY_PARAMS_cuMemcpyAtoHAsync_v2 \
  (void*, dst), (CUarray, src), (size_t, offset), (size_t, bytes), (CUstream, stream)
#define COPY_ARGS_cuMemcpyAtoHAsync_v2 (dst, src, offset, bytes, stream)
#define COPY_PARAMS_cuMemcpy3DPeer (const CUDA_MEMCPY3D_PEER*, copy)
#define COPY_ARGS_cuMemcpy3DPeer (copy)
#define COPY_PARAMS_cuMemcpy3DPeerAsync (const CUDA_MEMCPY3D_PEER*, copy), (CUstream, stream)
#define COPY_ARGS_cuMemcpy3DPeerAsync (copy, stream)
// Batches: CUDA 12.8's form (a failure index) and CUDA 13's.
#define COPY_PARAMS_cuMemcpyBatchAsync                                                   \
  (CUdeviceptr*, dsts), (CUdeviceptr*, srcs), (size_t*, sizes), (size_t, count),         \
      (CUmemcpyAttributes*, attrs), (size_t*, attr_idxs), (size_t, num_attrs), (size_t*, fail_idx), \
      (CUstream, stream)
#define COPY_ARGS_cuMemcpyBatchAsync \
  (dsts, srcs, sizes, count, attrs, attr_idxs, num_attrs, fail_idx, stream)
#define COPY_PARAMS_cuMemcpyBatchAsync_v2                                                \
  (CUdeviceptr*, dsts), (CUdeviceptr*, srcs), (size_t*, sizes), (size_t, count),         \
      (CUmemcpyAttributes*, attrs), (size_t*, attr_idxs), (size_t, num_attrs), (CUstream, stream)
#define COPY_ARGS_cuMemcpyBatchAsync_v2 (dsts, srcs, sizes, count, attrs, attr_idxs, num_attrs, stream)
#define COPY_PARAMS_cuMemcpy3DBatchAsync                                                 \
  (size_t, count), (CUDA_MEMCPY3D_BATCH_OP*, ops), (size_t*, fail_idx),                  \
      (unsigned long long, flags), (CUstream, stream)
#define COPY_ARGS_cuMemcpy3DBatchAsync (count, ops, fail_idx, flags, stream)
#define COPY_PARAMS_cuMemcpy3DBatchAsync_v2 \
  (size_t, count), (CUDA_MEMCPY3D_BATCH_OP*, ops), (unsigned long long, flags), (CUstream, stream)
#define COPY_ARGS_cuMemcpy3DBatchAsync_v2 (count, ops, flags, stream)

#define GUARD_HTOA(api) GuardCopySide(HostAddr(src), bytes)
#define GUARD_ATOH(api) GuardCopySide(HostAddr(dst), bytes)
#define GUARD_PEER(api) GuardCopy3DPeer(copy)
#define GUARD_BATCH(api) GuardBatch(dsts, srcs, sizes, count)
#define GUARD_BATCH3D(api) GuardBatch3D(count, ops)
#define AFTER_HTOA(s) AfterCopy(result, HostAddr(src), bytes, s)
#define AFTER_ATOH(s) AfterCopy(result, HostAddr(dst), bytes, s)
#define AFTER_PEER(s) AfterCopy3D(result, copy, s)
#define AFTER_BATCH(s) AfterBatch(result, dsts, srcs, sizes, count, s)
#define AFTER_BATCH3D(s) AfterBatch3D(result, count, ops, s)
SYNC_COPY_HOOKS(cuMemcpyHtoA_v2, GUARD_HTOA)
SYNC_COPY_HOOKS(cuMemcpyAtoH_v2, GUARD_ATOH)
SYNC_COPY_HOOKS(cuMemcpy3DPeer, GUARD_PEER)
COPY_HOOKS(cuMemcpyHtoAAsync_v2, GUARD_HTOA, AFTER_HTOA)
COPY_HOOKS(cuMemcpyAtoHAsync_v2, GUARD_ATOH, AFTER_ATOH)
COPY_HOOKS(cuMemcpy3DPeerAsync, GUARD_PEER, AFTER_PEER)
COPY_HOOKS(cuMemcpyBatchAsync, GUARD_BATCH, AFTER_BATCH)
COPY_HOOKS(cuMemcpyBatchAsync_v2, GUARD_BATCH, AFTER_BATCH)
COPY_HOOKS(cuMemcpy3DBatchAsync, GUARD_BATCH3D, AFTER_BATCH3D)
COPY_HOOKS(cuMemcpy3DBatchAsync_v2, GUARD_BATCH3D, AFTER_BATCH3D)

// ---- pointer queries: memory the program unregistered must look unregistered
// (Dispatch::QueryAddress), without losing what lazypin keeps there.
namespace lazypin {
namespace {
CUdeviceptr QueryAddress(CUdeviceptr ptr) {
  Dispatch* dispatch = PublishedDispatch();
  return dispatch != nullptr ? dispatch->QueryAddress(ptr) : ptr;
}
void* QueryAddress(void* p) {
  return reinterpret_cast<void*>(QueryAddress(static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p))));
}
// An answer about `asked` instead of `ptr`: a pointer it gives that is
// `asked` (the driver names unregistered memory's host pointer so) is `ptr`.
void AnswerAbout(CUpointer_attribute attribute, void* data, CUdeviceptr asked, CUdeviceptr ptr) {
  if (asked == ptr || data == nullptr) return;
  if (attribute == CU_POINTER_ATTRIBUTE_HOST_POINTER) {
    void** host = static_cast<void**>(data);
    if (reinterpret_cast<CUdeviceptr>(*host) == asked) *host = reinterpret_cast<void*>(ptr);
  } else if (attribute == CU_POINTER_ATTRIBUTE_DEVICE_POINTER ||
             attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) {
    CUdeviceptr* device = static_cast<CUdeviceptr*>(data);
    if (*device == asked) *device = ptr;
  }
}
}  // namespace
}  // namespace lazypin

HOOK(cuPointerGetAttribute, CUresult, DriverSymbol, (void*, data),
     (CUpointer_attribute, attribute), (CUdeviceptr, ptr)) {
  const CUdeviceptr asked = QueryAddress(ptr);
  const CUresult result = real(data, attribute, asked);
  if (result == CUDA_SUCCESS) AnswerAbout(attribute, data, asked, ptr);
  return result;
}

HOOK(cuPointerGetAttributes, CUresult, DriverSymbol, (unsigned int, count),
     (CUpointer_attribute*, attributes), (void**, data), (CUdeviceptr, ptr)) {
  const CUdeviceptr asked = QueryAddress(ptr);
  const CUresult result = real(count, attributes, data, asked);
  if (result == CUDA_SUCCESS && attributes != nullptr && data != nullptr) {
    for (unsigned int i = 0; i < count; ++i) AnswerAbout(attributes[i], data[i], asked, ptr);
  }
  return result;
}

HOOK(cuMemHostGetFlags, CUresult, DriverSymbol, (unsigned int*, flags), (void*, p)) {
  return real(flags, QueryAddress(p));
}

HOOK(cuMemHostGetDevicePointer_v2, CUresult, DriverSymbol, (CUdeviceptr*, dptr), (void*, p),
     (unsigned int, flags)) {
  return real(dptr, QueryAddress(p), flags);
}

// ---- the getter: hand back our hooks for the entry points we own -----------
HOOK(cuGetProcAddress, CUresult, DriverSymbol, (const char*, symbol), (void**, pfn), (int, version),
     (cuuint64_t, flags)) {
  const CUresult result = real(symbol, pfn, version, flags);
  if (result == CUDA_SUCCESS) SwapForHook(symbol, version, flags, pfn);
  return result;
}

HOOK(cuGetProcAddress_v2, CUresult, DriverSymbol, (const char*, symbol), (void**, pfn),
     (int, version), (cuuint64_t, flags), (CUdriverProcAddressQueryResult*, status)) {
  const CUresult result = real(symbol, pfn, version, flags, status);
  if (result == CUDA_SUCCESS) SwapForHook(symbol, version, flags, pfn);
  return result;
}

// ---- stream capture: tracked so that lazypin's releases leave it alone ------
// (capture.h). Every form the driver exports, and the getter's `_ptsz` ones
// (per-thread default stream). The tracker is updated around the real call,
// never holding its lock across it.
namespace lazypin {
namespace {

// The stream a handle names: the per-thread default stream is a different
// one on each thread (an odd key: stream handles are aligned pointers).
bool PerThreadStream(CUstream stream, bool ptsz) {
  return stream == CU_STREAM_PER_THREAD || (ptsz && stream == nullptr);
}
uint64_t CaptureKey(CUstream stream, bool ptsz) {
  return PerThreadStream(stream, ptsz) ? CaptureThreadId() | 1
                                       : static_cast<uint64_t>(reinterpret_cast<uintptr_t>(stream));
}

uint64_t RecordingCapture(CUstream stream) {
  // The legacy stream is never captured (and is not asked: during a capture
  // the driver may call that an implicit synchronization).
  if (!Captures().Any() || t_state.inside || stream == nullptr || stream == CU_STREAM_LEGACY) {
    return 0;
  }
  auto is_capturing = driver::StreamIsCapturing();
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (is_capturing == nullptr || is_capturing(stream, &status) != CUDA_SUCCESS ||
      status != CU_STREAM_CAPTURE_STATUS_ACTIVE) {
    return 0;
  }
  return CaptureKey(stream, false);
}

template <typename Begin>
CUresult TrackedBeginCapture(CUstream stream, CUstreamCaptureMode mode, bool ptsz, Begin begin) {
  CUcontext ctx = nullptr;
  auto stream_ctx = driver::StreamGetCtx();
  if (stream_ctx == nullptr || stream_ctx(stream, &ctx) != CUDA_SUCCESS || ctx == nullptr) {
    if (auto current = driver::CtxGetCurrent()) current(&ctx);
  }
  const uint64_t key = CaptureKey(stream, ptsz);
  int handle;
  {
    ScopedInsideLazypin inside;  // a signal handler's hook on this thread leaves the tracker alone
    Graphs().EndCapture(key, nullptr);  // what an earlier capture of the stream left
    handle = Captures().Begin(key, ctx, static_cast<CaptureMode>(mode), CaptureThreadId());
  }
  const CUresult result = begin();
  if (result != CUDA_SUCCESS) {
    ScopedInsideLazypin inside;
    Captures().Refused(handle);
  }
  return result;
}

template <typename End>
CUresult TrackedEndCapture(CUstream stream, bool ptsz, CUgraph* graph, End end) {
  const CUresult result = end();
  if (result == CUDA_SUCCESS && graph != nullptr && Graphs().Any()) {
    ScopedInsideLazypin inside;
    Graphs().EndCapture(CaptureKey(stream, ptsz), *graph);  // the copies it recorded
  }
  // Ended, or ended by invalidation (901); a refused end (wrong thread) is
  // not: the driver's own view decides, where it can be asked.
  bool ended = result == CUDA_SUCCESS || result == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED ||
               result == CUDA_ERROR_ILLEGAL_STATE;
  auto is_capturing = ptsz ? driver::StreamIsCapturingPtsz() : driver::StreamIsCapturing();
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  const CUstream asked = PerThreadStream(stream, ptsz) ? CU_STREAM_PER_THREAD : stream;
  if (is_capturing != nullptr && is_capturing(asked, &status) == CUDA_SUCCESS) {
    ended = status == CU_STREAM_CAPTURE_STATUS_NONE;
  }
  if (ended && Captures().Any()) {
    ScopedInsideLazypin inside;
    Captures().Ended(CaptureKey(stream, ptsz));
  }
  return result;
}

}  // namespace
}  // namespace lazypin

HOOK(cuStreamBeginCapture, CUresult, DriverSymbol, (CUstream, stream)) {
  return TrackedBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL, false, [&] { return real(stream); });
}
HOOK(cuStreamBeginCapture_ptsz, CUresult, DriverSymbol, (CUstream, stream)) {
  return TrackedBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL, true, [&] { return real(stream); });
}
HOOK(cuStreamBeginCapture_v2, CUresult, DriverSymbol, (CUstream, stream), (CUstreamCaptureMode, mode)) {
  return TrackedBeginCapture(stream, mode, false, [&] { return real(stream, mode); });
}
HOOK(cuStreamBeginCapture_v2_ptsz, CUresult, DriverSymbol, (CUstream, stream),
     (CUstreamCaptureMode, mode)) {
  return TrackedBeginCapture(stream, mode, true, [&] { return real(stream, mode); });
}
HOOK(cuStreamBeginCaptureToGraph, CUresult, DriverSymbol, (CUstream, stream), (CUgraph, graph),
     (const CUgraphNode*, deps), (const CUgraphEdgeData*, edges), (size_t, count),
     (CUstreamCaptureMode, mode)) {
  return TrackedBeginCapture(stream, mode, false,
                             [&] { return real(stream, graph, deps, edges, count, mode); });
}
HOOK(cuStreamBeginCaptureToGraph_ptsz, CUresult, DriverSymbol, (CUstream, stream), (CUgraph, graph),
     (const CUgraphNode*, deps), (const CUgraphEdgeData*, edges), (size_t, count),
     (CUstreamCaptureMode, mode)) {
  return TrackedBeginCapture(stream, mode, true,
                             [&] { return real(stream, graph, deps, edges, count, mode); });
}
HOOK(cuStreamEndCapture, CUresult, DriverSymbol, (CUstream, stream), (CUgraph*, graph)) {
  return TrackedEndCapture(stream, false, graph, [&] { return real(stream, graph); });
}
HOOK(cuStreamEndCapture_ptsz, CUresult, DriverSymbol, (CUstream, stream), (CUgraph*, graph)) {
  return TrackedEndCapture(stream, true, graph, [&] { return real(stream, graph); });
}

// ---- graphs: a memcpy node never copies through a deferred registration ----
// (graph_ranges.h; docs/design.md, "Graphs"). Each memcpy node's host ranges
// are noted for its graph (explicit nodes here, captured copies by the copy
// hooks above), carried to the executable graphs made from it, and released
// from the pool before the graph is instantiated or launched.
namespace {

// A memcpy node of `owner` (null: a node whose graph is unknown).
void NoteGraphCopy(const void* owner, const CUDA_MEMCPY3D* copy) {
  Dispatch* dispatch = t_state.inside ? nullptr : DeferringDispatch();
  CopySide dst, src;
  if (dispatch == nullptr || !Sides3D(copy, &dst, &src)) return;
  NoteGraphRange(dispatch, owner, dst.lo, RangeEnd(dst.lo, dst.bytes));
  NoteGraphRange(dispatch, owner, src.lo, RangeEnd(src.lo, src.bytes));
}
void NoteGraphNode(const void* owner, const CUgraphNodeParams* params) {
  if (params != nullptr && params->type == CU_GRAPH_NODE_TYPE_MEMCPY) {
    NoteGraphCopy(owner, &params->memcpy.copyParams);
  }
}

// `owner` (a graph about to be instantiated, an executable graph about to be
// launched) may copy its ranges now: release what the pool defers there.
void BeforeGraphRuns(const void* owner) {
  if (!Graphs().Any() || t_state.inside) return;
  Dispatch* dispatch = DeferringDispatch();
  if (dispatch == nullptr || dispatch->pool()->Empty()) return;  // nothing deferred anywhere
  std::vector<GraphRanges::Range> ranges;
  {
    ScopedInsideLazypin inside;
    Graphs().ForEach(owner, [&](GraphRanges::Range r) { ranges.push_back(r); });
  }
  for (const GraphRanges::Range& r : ranges) dispatch->BeforeGraphUse(r.lo, r.hi);
}

void CopyGraphRanges(CUresult result, const void* from, const void* to) {
  if (result != CUDA_SUCCESS || to == nullptr || !Graphs().Any() || t_state.inside) return;
  ScopedInsideLazypin inside;
  Graphs().CopyTo(from, to);
}

void ForgetGraph(CUresult result, const void* owner) {
  if (result != CUDA_SUCCESS || !Graphs().Any() || t_state.inside) return;
  ScopedInsideLazypin inside;
  Graphs().Forget(owner);
}

}  // namespace

HOOK(cuGraphAddMemcpyNode, CUresult, DriverSymbol, (CUgraphNode*, node), (CUgraph, graph),
     (const CUgraphNode*, deps), (size_t, count), (const CUDA_MEMCPY3D*, copy), (CUcontext, ctx)) {
  NoteGraphCopy(graph, copy);
  return real(node, graph, deps, count, copy, ctx);
}
HOOK(cuGraphAddNode, CUresult, DriverSymbol, (CUgraphNode*, node), (CUgraph, graph),
     (const CUgraphNode*, deps), (size_t, count), (CUgraphNodeParams*, params)) {
  NoteGraphNode(graph, params);
  return real(node, graph, deps, count, params);
}
HOOK(cuGraphAddNode_v2, CUresult, DriverSymbol, (CUgraphNode*, node), (CUgraph, graph),
     (const CUgraphNode*, deps), (const CUgraphEdgeData*, edges), (size_t, count),
     (CUgraphNodeParams*, params)) {
  NoteGraphNode(graph, params);
  return real(node, graph, deps, edges, count, params);
}
HOOK(cuGraphMemcpyNodeSetParams, CUresult, DriverSymbol, (CUgraphNode, node),
     (const CUDA_MEMCPY3D*, copy)) {
  NoteGraphCopy(nullptr, copy);
  return real(node, copy);
}
HOOK(cuGraphNodeSetParams, CUresult, DriverSymbol, (CUgraphNode, node), (CUgraphNodeParams*, params)) {
  NoteGraphNode(nullptr, params);
  return real(node, params);
}
HOOK(cuGraphExecMemcpyNodeSetParams, CUresult, DriverSymbol, (CUgraphExec, exec), (CUgraphNode, node),
     (const CUDA_MEMCPY3D*, copy), (CUcontext, ctx)) {
  NoteGraphCopy(exec, copy);
  return real(exec, node, copy, ctx);
}
HOOK(cuGraphExecNodeSetParams, CUresult, DriverSymbol, (CUgraphExec, exec), (CUgraphNode, node),
     (CUgraphNodeParams*, params)) {
  NoteGraphNode(exec, params);
  return real(exec, node, params);
}
HOOK(cuGraphAddChildGraphNode, CUresult, DriverSymbol, (CUgraphNode*, node), (CUgraph, graph),
     (const CUgraphNode*, deps), (size_t, count), (CUgraph, child)) {
  const CUresult result = real(node, graph, deps, count, child);
  CopyGraphRanges(result, child, graph);
  return result;
}
HOOK(cuGraphClone, CUresult, DriverSymbol, (CUgraph*, clone), (CUgraph, original)) {
  const CUresult result = real(clone, original);
  CopyGraphRanges(result, original, clone != nullptr ? *clone : nullptr);
  return result;
}
HOOK(cuGraphInstantiateWithFlags, CUresult, DriverSymbol, (CUgraphExec*, exec), (CUgraph, graph),
     (unsigned long long, flags)) {
  BeforeGraphRuns(graph);
  const CUresult result = real(exec, graph, flags);
  CopyGraphRanges(result, graph, exec != nullptr ? *exec : nullptr);
  return result;
}
#define INSTANTIATE_WITH_PARAMS_HOOK(NAME)                                                      \
  HOOK(NAME, CUresult, DriverSymbol, (CUgraphExec*, exec), (CUgraph, graph),                    \
       (CUDA_GRAPH_INSTANTIATE_PARAMS*, params)) {                                              \
    BeforeGraphRuns(graph);                                                                     \
    const CUresult result = real(exec, graph, params);                                          \
    CopyGraphRanges(result, graph, exec != nullptr ? *exec : nullptr);                          \
    return result;                                                                              \
  }
INSTANTIATE_WITH_PARAMS_HOOK(cuGraphInstantiateWithParams)
INSTANTIATE_WITH_PARAMS_HOOK(cuGraphInstantiateWithParams_ptsz)
HOOK(cuGraphExecUpdate_v2, CUresult, DriverSymbol, (CUgraphExec, exec), (CUgraph, graph),
     (CUgraphExecUpdateResultInfo*, info)) {
  const CUresult result = real(exec, graph, info);
  CopyGraphRanges(result, graph, exec);
  return result;
}
HOOK(cuGraphLaunch, CUresult, DriverSymbol, (CUgraphExec, exec), (CUstream, stream)) {
  BeforeGraphRuns(exec);
  return real(exec, stream);
}
HOOK(cuGraphLaunch_ptsz, CUresult, DriverSymbol, (CUgraphExec, exec), (CUstream, stream)) {
  BeforeGraphRuns(exec);
  return real(exec, stream);
}
HOOK(cuGraphDestroy, CUresult, DriverSymbol, (CUgraph, graph)) {
  const CUresult result = real(graph);
  ForgetGraph(result, graph);
  return result;
}
HOOK(cuGraphExecDestroy, CUresult, DriverSymbol, (CUgraphExec, exec)) {
  const CUresult result = real(exec);
  ForgetGraph(result, exec);
  return result;
}

// ---- runtime hooks (hooks_runtime.cc) join the same table ------------------
namespace lazypin {
namespace {

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
#define RUNTIME_ENTRY(NAME)                                                             \
  {#NAME, nullptr, 0, -1, HookEntry::Stream::kAny,                                      \
   [](Via via) { return RuntimeHookOf(#NAME, via); },                                   \
   [](Via via, void* fn) { return OfferRuntimeReal(#NAME, via, fn); }}
const HookEntry kHooks[] = {
    ENTRY(cuMemHostRegister, "cuMemHostRegister", 0, 6049),
    ENTRY(cuMemHostRegister_v2, "cuMemHostRegister", 6050, INT_MAX),
    ENTRY(cuMemHostUnregister, "cuMemHostUnregister", 0, INT_MAX),
    ENTRY(cuMemHostAlloc, "cuMemHostAlloc", 0, INT_MAX),
    ENTRY(cuMemAllocHost, "cuMemAllocHost", 0, 3019),
    ENTRY(cuMemAllocHost_v2, "cuMemAllocHost", 3020, INT_MAX),
    ENTRY(cuMemFreeHost, "cuMemFreeHost", 0, INT_MAX),
    ENTRY(cuCtxDestroy, "cuCtxDestroy", 0, 3999),
    ENTRY(cuCtxDestroy_v2, "cuCtxDestroy", 4000, INT_MAX),
    ENTRY(cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset", 0, 10999),
    ENTRY(cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset", 11000, INT_MAX),
    ENTRY(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", 0, 10999),
    ENTRY(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 11000, INT_MAX),
    ENTRY(cuPointerGetAttribute, "cuPointerGetAttribute", 0, INT_MAX),
    ENTRY(cuPointerGetAttributes, "cuPointerGetAttributes", 0, INT_MAX),
    ENTRY(cuMemHostGetFlags, "cuMemHostGetFlags", 0, INT_MAX),
    ENTRY(cuMemHostGetDevicePointer_v2, "cuMemHostGetDevicePointer", 3020, INT_MAX),
    ENTRY(cuGetProcAddress, "cuGetProcAddress", 0, 11999),
    ENTRY(cuGetProcAddress_v2, "cuGetProcAddress", 12000, INT_MAX),
    COPY_ENTRIES(cuMemcpyHtoDAsync_v2, "cuMemcpyHtoDAsync", 3020),
    COPY_ENTRIES(cuMemcpyDtoHAsync_v2, "cuMemcpyDtoHAsync", 3020),
    COPY_ENTRIES(cuMemcpyAsync, "cuMemcpyAsync", 4000),
    COPY_ENTRIES(cuMemcpy2DAsync_v2, "cuMemcpy2DAsync", 3020),
    COPY_ENTRIES(cuMemcpy3DAsync_v2, "cuMemcpy3DAsync", 3020),
    SYNC_COPY_ENTRIES(cuMemcpyHtoD_v2, "cuMemcpyHtoD", 3020),
    SYNC_COPY_ENTRIES(cuMemcpyDtoH_v2, "cuMemcpyDtoH", 3020),
    SYNC_COPY_ENTRIES(cuMemcpy, "cuMemcpy", 4000),
    SYNC_COPY_ENTRIES(cuMemcpy2D_v2, "cuMemcpy2D", 3020),
    SYNC_COPY_ENTRIES(cuMemcpy2DUnaligned_v2, "cuMemcpy2DUnaligned", 3020),
    SYNC_COPY_ENTRIES(cuMemcpy3D_v2, "cuMemcpy3D", 3020),
    SYNC_COPY_ENTRIES(cuMemcpyHtoA_v2, "cuMemcpyHtoA", 3020),
    SYNC_COPY_ENTRIES(cuMemcpyAtoH_v2, "cuMemcpyAtoH", 3020),
    SYNC_COPY_ENTRIES(cuMemcpy3DPeer, "cuMemcpy3DPeer", 4000),
    COPY_ENTRIES(cuMemcpyHtoAAsync_v2, "cuMemcpyHtoAAsync", 3020),
    COPY_ENTRIES(cuMemcpyAtoHAsync_v2, "cuMemcpyAtoHAsync", 3020),
    COPY_ENTRIES(cuMemcpy3DPeerAsync, "cuMemcpy3DPeerAsync", 4000),
    ENTRY_FOR(cuMemcpyBatchAsync, "cuMemcpyBatchAsync", 12080, 12999, kLegacy),
    ENTRY_FOR(cuMemcpyBatchAsync_ptsz, "cuMemcpyBatchAsync", 12080, 12999, kPerThread),
    ENTRY_FOR(cuMemcpyBatchAsync_v2, "cuMemcpyBatchAsync", 13000, INT_MAX, kLegacy),
    ENTRY_FOR(cuMemcpyBatchAsync_v2_ptsz, "cuMemcpyBatchAsync", 13000, INT_MAX, kPerThread),
    ENTRY_FOR(cuMemcpy3DBatchAsync, "cuMemcpy3DBatchAsync", 12080, 12999, kLegacy),
    ENTRY_FOR(cuMemcpy3DBatchAsync_ptsz, "cuMemcpy3DBatchAsync", 12080, 12999, kPerThread),
    ENTRY_FOR(cuMemcpy3DBatchAsync_v2, "cuMemcpy3DBatchAsync", 13000, INT_MAX, kLegacy),
    ENTRY_FOR(cuMemcpy3DBatchAsync_v2_ptsz, "cuMemcpy3DBatchAsync", 13000, INT_MAX, kPerThread),
    // ---- graphs
    ENTRY(cuGraphAddMemcpyNode, "cuGraphAddMemcpyNode", 10000, INT_MAX),
    ENTRY(cuGraphAddNode, "cuGraphAddNode", 12020, 12029),
    ENTRY(cuGraphAddNode_v2, "cuGraphAddNode", 12030, INT_MAX),
    ENTRY(cuGraphMemcpyNodeSetParams, "cuGraphMemcpyNodeSetParams", 10000, INT_MAX),
    ENTRY(cuGraphNodeSetParams, "cuGraphNodeSetParams", 12020, INT_MAX),
    ENTRY(cuGraphExecMemcpyNodeSetParams, "cuGraphExecMemcpyNodeSetParams", 10020, INT_MAX),
    ENTRY(cuGraphExecNodeSetParams, "cuGraphExecNodeSetParams", 12020, INT_MAX),
    ENTRY(cuGraphAddChildGraphNode, "cuGraphAddChildGraphNode", 10000, INT_MAX),
    ENTRY(cuGraphClone, "cuGraphClone", 10000, INT_MAX),
    ENTRY(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", 11040, INT_MAX),
    ENTRY(cuGraphInstantiateWithFlags, "cuGraphInstantiate", 12000, INT_MAX),
    ENTRY_FOR(cuGraphInstantiateWithParams, "cuGraphInstantiateWithParams", 12000, INT_MAX, kLegacy),
    ENTRY_FOR(cuGraphInstantiateWithParams_ptsz, "cuGraphInstantiateWithParams", 12000, INT_MAX,
              kPerThread),
    ENTRY(cuGraphExecUpdate_v2, "cuGraphExecUpdate", 12000, INT_MAX),
    ENTRY_FOR(cuGraphLaunch, "cuGraphLaunch", 10000, INT_MAX, kLegacy),
    ENTRY_FOR(cuGraphLaunch_ptsz, "cuGraphLaunch", 10000, INT_MAX, kPerThread),
    ENTRY(cuGraphDestroy, "cuGraphDestroy", 10000, INT_MAX),
    ENTRY(cuGraphExecDestroy, "cuGraphExecDestroy", 10000, INT_MAX),
    // ---- stream capture
    ENTRY_FOR(cuStreamBeginCapture, "cuStreamBeginCapture", 0, 10009, kLegacy),
    ENTRY_FOR(cuStreamBeginCapture_ptsz, "cuStreamBeginCapture", 0, 10009, kPerThread),
    ENTRY_FOR(cuStreamBeginCapture_v2, "cuStreamBeginCapture", 10010, INT_MAX, kLegacy),
    ENTRY_FOR(cuStreamBeginCapture_v2_ptsz, "cuStreamBeginCapture", 10010, INT_MAX, kPerThread),
    ENTRY_FOR(cuStreamBeginCaptureToGraph, "cuStreamBeginCaptureToGraph", 0, INT_MAX, kLegacy),
    ENTRY_FOR(cuStreamBeginCaptureToGraph_ptsz, "cuStreamBeginCaptureToGraph", 0, INT_MAX, kPerThread),
    ENTRY_FOR(cuStreamEndCapture, "cuStreamEndCapture", 0, INT_MAX, kLegacy),
    ENTRY_FOR(cuStreamEndCapture_ptsz, "cuStreamEndCapture", 0, INT_MAX, kPerThread),
    RUNTIME_ENTRY(cudaHostRegister),
    RUNTIME_ENTRY(cudaHostUnregister),
    RUNTIME_ENTRY(cudaHostAlloc),
    RUNTIME_ENTRY(cudaMallocHost),
    RUNTIME_ENTRY(cudaFreeHost),
};

const HookEntry* FindByName(const char* name) {
  for (const HookEntry& e : kHooks) {
    if (strcmp(e.name, name) == 0) return &e;
  }
  return nullptr;
}

// cudart (or a program) is asking the driver's getter for its entry points:
// CUDA is being set up, before the program's first registration (maybe from
// a library constructor, under the loader's lock: TrySetUp never waits for
// another thread's set-up). lazypin sets itself up here, once, so that the
// program's first registration finds everything ready: its threads start
// first as spares (PrepareSpareThreads), which the set-up hands their bodies:
// the log's writer; deferring, also the collector, the kernel watch's reader
// and unwatch thread, and the first context's idle waiter. Spares it did not
// need end.
void SetUpWithCuda() {
  static std::atomic<bool> done{false};
  if (done.load(std::memory_order_relaxed) || done.exchange(true)) return;
  if (PublishedState() != nullptr) return;  // set up already
  const Mode mode = PeekConfig([](const char* name) { return getenv(name); }, {"LAZYPIN_MODE"}).mode;
  if (mode == Mode::kOff) return;
  PrepareSpareThreads(mode == Mode::kDefer ? 5 : 1);
  if (TrySetUp()) EndUnusedSpareThreads();
}

void* DlsymHooked(void* handle, const char* symbol, const HookEntry& entry) {
  void* fn = real::Dlsym()(handle, symbol);
  if (fn == nullptr && handle == RTLD_DEFAULT) {
    // A caller loaded RTLD_LOCAL may see libcuda/libcudart where we cannot.
    fn = entry.proc_name != nullptr ? real::Driver(symbol) : real::Runtime(symbol);
  }
  if (fn == nullptr || IsOurs(fn) || !entry.offer(Via::kDlsym, fn)) return fn;
  return entry.hook(Via::kDlsym);
}

}  // namespace

void SwapForHook(const char* symbol, int version, uint64_t flags, void** pfn) {
  if (symbol == nullptr || pfn == nullptr || *pfn == nullptr || IsOurs(*pfn)) return;
  SetUpWithCuda();
  const HookEntry::Stream stream = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
                                       ? HookEntry::Stream::kPerThread
                                       : HookEntry::Stream::kLegacy;
  for (const HookEntry& e : kHooks) {
    if (e.proc_name != nullptr && strcmp(e.proc_name, symbol) == 0 && version >= e.min_version &&
        version <= e.max_version && (e.stream == HookEntry::Stream::kAny || e.stream == stream)) {
      if (e.offer(Via::kGetProc, *pfn)) *pfn = e.hook(Via::kGetProc);
      return;
    }
  }
}

}  // namespace lazypin

// glibc's dlsym looks in the caller's scope (RTLD_NEXT, RTLD_DEFAULT): every
// lookup of a name we do not hook leaves here as a tail call, so that glibc
// still sees the program's return address. RTLD_NEXT lookups of hooked names
// are the program's own interposition and pass through untouched.
#pragma GCC diagnostic ignored "-Wnonnull-compare"  // glibc says nonnull; programs pass null
LAZYPIN_EXPORT void* dlsym(void* __restrict handle, const char* __restrict symbol) {
  if (symbol != nullptr && symbol[0] == 'c' && symbol[1] == 'u' && handle != RTLD_NEXT) {
    if (const HookEntry* entry = FindByName(symbol)) return DlsymHooked(handle, symbol, *entry);
  }
  return real::Dlsym()(handle, symbol);
}
