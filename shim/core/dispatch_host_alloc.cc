// dispatch_host_alloc: the path of one pinned host allocation or free
// (cudaHostAlloc, cudaMallocHost, cuMemHostAlloc, cuMemAllocHost(_v2),
// cudaFreeHost, cuMemFreeHost), as Dispatch::Runtime / Driver are for
// registrations (see dispatch.h).
#include "dispatch.h"
#include "host_alloc_cache.h"
#include "thread_state.h"

namespace lazypin {

int Dispatch::FreeCachedHostBlocks(uintptr_t lo, uintptr_t hi, EvictReason reason) {
  if (host_cache_ == nullptr || !host_cache_->MaybeHolds()) return 0;
  ScopedInsideLazypin inside;
  return host_cache_->Invalidate(lo, hi, reason);
}

Outcome Dispatch::HostAct(const ProgramCall& call, Api origin, void** out,
                          absl::FunctionRef<int()> real) {
  if (host_cache_ == nullptr) return Outcome{real(), Action::kForward, 0};
  // No current context: the driver refuses (201); forward, so that it does.
  const Context ctx = env_->CurrentContext();
  if (ctx == nullptr) return Outcome{real(), Action::kForward, 0};
  // During a capture that the driver's allocation would break (900), the
  // driver answers, as it does bare.
  if (IsHostAlloc(call.api) && env_->CaptureForbidsDeferral()) {
    return Outcome{real(), Action::kForward, 0};
  }
  if (IsHostAlloc(call.api)) {
    HostAllocRequest request;
    request.bytes = call.bytes;
    request.flags = HostAllocRequest::Flags(call.flags, static_cast<unsigned>(origin));
    request.ctx = ctx;
    request.device = env_->DeviceOf(ctx);
    ScopedInsideLazypin inside;
    return host_cache_->Alloc(request, out, real);
  }
  // A free kept in the cache keeps the driver's implicit wait for the device
  // (LAZYPIN_UNREGISTER_WAIT, as for an unregister), and one the driver
  // would refuse during a capture (900) is the driver's.
  ScopedInsideLazypin inside;
  return host_cache_->Free(reinterpret_cast<uintptr_t>(call.ptr), real, [&] {
    return !env_->CaptureForbidsDeferral() && WaitBeforeDefer(ctx);
  });
}

int Dispatch::HostRuntime(const ProgramCall& call, void** out, absl::FunctionRef<int()> real) {
  sink_->CallStarts(call);
  const int64_t t0 = env_->NowNs();
  RuntimeFrame frame;
  frame.api = call.api;
  const Outcome outcome = ThroughRuntime(frame, real);
  ProgramCall recorded = call;
  if (IsHostAlloc(call.api)) {
    recorded.ptr = outcome.result == kCudaSuccess && out != nullptr ? *out : nullptr;
  }
  Record(recorded, outcome, t0);
  return outcome.result;
}

int Dispatch::HostDriver(const ProgramCall& call, void** out, absl::FunctionRef<int()> real) {
  if (RuntimeFrame* frame = t_state.runtime_frame) {
    // cudart on behalf of the runtime call above.
    return IntoFrame(*frame, [&] { return HostAct(call, frame->api, out, real); });
  }
  sink_->CallStarts(call);
  const int64_t t0 = env_->NowNs();
  const Outcome outcome = HostAct(call, call.api, out, real);
  ProgramCall recorded = call;
  if (IsHostAlloc(call.api)) {
    recorded.ptr = outcome.result == kCudaSuccess && out != nullptr ? *out : nullptr;
  }
  Record(recorded, outcome, t0);
  return outcome.result;
}

}  // namespace lazypin
