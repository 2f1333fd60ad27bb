// hooks_capture: the driver's stream-capture hooks (capture.h), tracked so
// that lazypin's releases leave a capture alone.
#include "driver_hook.h"  // first: cuda.h's names as the driver exports them

#include "capture.h"
#include "driver_calls.h"
#include "graph_ranges.h"

using namespace lazypin;  // NOLINT: the hooks below are C symbols

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

}  // namespace

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

namespace {

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


HOOK_TABLE(CaptureHooks,
    ENTRY_FOR(cuStreamBeginCapture, "cuStreamBeginCapture", 0, 10009, kLegacy),
    ENTRY_FOR(cuStreamBeginCapture_ptsz, "cuStreamBeginCapture", 0, 10009, kPerThread),
    ENTRY_FOR(cuStreamBeginCapture_v2, "cuStreamBeginCapture", 10010, INT_MAX, kLegacy),
    ENTRY_FOR(cuStreamBeginCapture_v2_ptsz, "cuStreamBeginCapture", 10010, INT_MAX, kPerThread),
    ENTRY_FOR(cuStreamBeginCaptureToGraph, "cuStreamBeginCaptureToGraph", 0, INT_MAX, kLegacy),
    ENTRY_FOR(cuStreamBeginCaptureToGraph_ptsz, "cuStreamBeginCaptureToGraph", 0, INT_MAX, kPerThread),
    ENTRY_FOR(cuStreamEndCapture, "cuStreamEndCapture", 0, INT_MAX, kLegacy),
    ENTRY_FOR(cuStreamEndCapture_ptsz, "cuStreamEndCapture", 0, INT_MAX, kPerThread))
