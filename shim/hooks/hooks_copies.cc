// hooks_copies: the driver's copy hooks. A copy from memory the program
// unregistered (kept registered by the pool) behaves as pageable: async
// copies synchronize or are staged, captured copies note their ranges for the
// graph; auto-pin (LAZYPIN_AUTOPIN) may pin a pageable side first.
#include "driver_hook.h"  // first: cuda.h's names as the driver exports them

#include <string.h>

#include "auto_pin.h"
#include "capture.h"
#include "copy_sides.h"
#include "driver_calls.h"
#include "graph_ranges.h"
#include "own_memory.h"
#include "pages.h"
#include "sys.h"

using namespace lazypin;  // NOLINT: the hooks below are C symbols

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
  if (!AutoPinAsked()) return nullptr;
  const ShimState* state = ActiveState(kHookSide);
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

HOOK_TABLE(CopyHooks,
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
    ENTRY_FOR(cuMemcpy3DBatchAsync_v2_ptsz, "cuMemcpy3DBatchAsync", 13000, INT_MAX, kPerThread))
