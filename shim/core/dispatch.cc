// dispatch: one program call's path (see dispatch.h).
#include "dispatch.h"

#include <optional>

#include "host_alloc_cache.h"
#include "pages.h"
#include "thread_state.h"

namespace lazypin {

RegisterRequest Dispatch::Request(const ProgramCall& call, Context ctx) {
  RegisterRequest request;
  request.ptr = reinterpret_cast<uintptr_t>(call.ptr);
  request.bytes = call.bytes;
  request.flags = call.flags;
  request.ctx = ctx;
  request.device = env_->DeviceOf(ctx);
  return request;
}

void Dispatch::Record(const ProgramCall& call, const Outcome& outcome, int64_t t0) {
  const int64_t end = env_->NowNs();
  ScopedInsideLazypin inside;
  sink_->Record(CallRecord{call, outcome.result, end - t0, outcome.action, outcome.evicted,
                          outcome.reason, end, env_->RecordedDevice()});
}

void Dispatch::FreeCachedHostBlocksUnder(const ProgramCall& call) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(call.ptr);
  FreeCachedHostBlocks(p, IsRegister(call.api) ? RangeEnd(p, call.bytes) : p + 1, EvictReason::kOverlap);
}

bool Dispatch::WaitBeforeDefer(Context ctx) {
  if (!unregister_wait_) return true;
  ScopedInsideLazypin inside;
  return env_->WaitForDevice(ctx) == kCudaSuccess;
}

Outcome Dispatch::Act(const ProgramCall& call, absl::FunctionRef<int()> real,
                      RuntimeFrame::Wait wait) {
  if (pool_ == nullptr) return Outcome{real(), Action::kForward, 0};
  const Context ctx = env_->CurrentContext();
  if (IsRegister(call.api)) {
    ScopedInsideLazypin inside;
    return pool_->Register(Request(call, ctx), real);
  }
  // With no current context the driver refuses (201) and keeps the
  // registration: forward, so that it does.
  // A capture that the driver's unregister would break: forward, so that it does.
  const bool may_defer = ctx != nullptr && wait != RuntimeFrame::Wait::kNoDefer &&
                         !env_->CaptureForbidsDeferral() &&
                         (wait == RuntimeFrame::Wait::kWaited || WaitBeforeDefer(ctx));
  ScopedInsideLazypin inside;
  return pool_->Unregister(reinterpret_cast<uintptr_t>(call.ptr), real, may_defer);
}

int Dispatch::Runtime(const ProgramCall& call, absl::FunctionRef<int()> real) {
  sink_->CallStarts(call);
  const int64_t t0 = env_->NowNs();
  // A hit or a deferral needs no driver call: take it here and spare the
  // program cudart's own path. A register needs the context cudart will use,
  // the current one (cudart uses it when there is one). Everything else goes
  // through cudart to the driver hook, so that cudart sees only the driver's
  // final answer (its last error too).
  // With no current context, cudart makes the primary context current first
  // (so the thread's state afterwards is cudart's): an unregister then goes
  // through cudart too, and the driver hook beneath decides.
  std::optional<Outcome> fast;
  RuntimeFrame frame;
  FreeCachedHostBlocksUnder(call);
  if (pool_ != nullptr) {
    if (Context ctx = env_->CurrentContext()) {
      if (IsRegister(call.api)) {
        ScopedInsideLazypin inside;
        fast = pool_->TryHit(Request(call, ctx));
      } else if (!env_->CaptureForbidsDeferral() && WaitBeforeDefer(ctx)) {
        frame.wait = RuntimeFrame::Wait::kWaited;
        ScopedInsideLazypin inside;
        fast = pool_->TryDefer(reinterpret_cast<uintptr_t>(call.ptr));
      } else {
        frame.wait = RuntimeFrame::Wait::kNoDefer;
      }
    }
  }
  const Outcome outcome = fast ? *fast : ThroughRuntime(frame, real);
  Record(call, outcome, t0);
  return outcome.result;
}

Outcome Dispatch::ThroughRuntime(RuntimeFrame& frame, absl::FunctionRef<int()> real) {
  int result;
  {
    ScopedRuntimeFrame open(&frame);
    result = real();
  }
  Outcome outcome = frame.outcome;
  outcome.result = result;  // cudart's answer, whatever the driver said
  return outcome;
}

int Dispatch::IntoFrame(RuntimeFrame& frame, absl::FunctionRef<Outcome()> act) {
  Outcome outcome;
  {
    ScopedRuntimeFrame none(nullptr);
    outcome = act();
  }
  frame.driver_calls += 1;
  frame.outcome.action = outcome.action;
  frame.outcome.reason = outcome.reason;
  frame.outcome.evicted += outcome.evicted;
  return outcome.result;
}

int Dispatch::Driver(const ProgramCall& call, absl::FunctionRef<int()> real) {
  if (RuntimeFrame* frame = t_state.runtime_frame) {
    // cudart on behalf of the runtime call above (which freed the kept host
    // blocks under it).
    return IntoFrame(*frame, [&] { return Act(call, real, frame->wait); });
  }
  sink_->CallStarts(call);
  const int64_t t0 = env_->NowNs();
  FreeCachedHostBlocksUnder(call);
  const Outcome outcome = Act(call, real, RuntimeFrame::Wait::kNotYet);
  Record(call, outcome, t0);
  return outcome.result;
}

void Dispatch::BeforeContextDestroy(Context ctx) {
  // The driver frees the context's host allocations: forget them.
  if (host_cache_ != nullptr) {
    ScopedInsideLazypin inside;
    host_cache_->ForgetContext(ctx);
  }
  if (pool_ == nullptr) return;
  ScopedInsideLazypin inside;
  pool_->DropContext(ctx);
}

void Dispatch::DropPrimary(int device, Context primary, bool forget_in_use) {
  if (host_cache_ != nullptr && forget_in_use) {
    primary != nullptr ? host_cache_->ForgetContext(primary) : host_cache_->ForgetDevice(device);
  }
  if (pool_ == nullptr) return;
  primary != nullptr ? pool_->DropContext(primary, forget_in_use)
                     : pool_->DropDevice(device, forget_in_use);
}

Context Dispatch::BeforePrimaryContextReset(int device, bool forget_in_use) {
  if (pool_ == nullptr && host_cache_ == nullptr) return nullptr;
  ScopedInsideLazypin inside;
  const Context primary = env_->ActivePrimaryContext(device);
  DropPrimary(device, primary, forget_in_use);
  return primary;
}

void Dispatch::AfterPrimaryContextRelease(int device, Context primary) {
  if (pool_ == nullptr && host_cache_ == nullptr) return;
  ScopedInsideLazypin inside;
  if (env_->PrimaryContextActive(device)) return;
  DropPrimary(device, primary, /*forget_in_use=*/true);
}

bool Dispatch::StreamIdle(void* stream) {
  ScopedInsideLazypin inside;
  return env_->StreamIdle(stream);
}

bool Dispatch::HoldsDeferred(uintptr_t lo, uintptr_t hi) {
  ScopedInsideLazypin inside;
  return pool_->HoldsDeferred(lo, hi);
}

void Dispatch::SynchronizeIfDeferred(uintptr_t lo, uintptr_t hi, void* stream) {
  if (HoldsDeferred(lo, hi)) {
    ScopedInsideLazypin inside;
    env_->SynchronizeStream(stream);
  }
}

void Dispatch::ApplyPageChangesBeforeCopy(uintptr_t lo, uintptr_t hi) {
  ScopedInsideLazypin inside;
  pool_->BeforeCopy(lo, hi);
}

void Dispatch::ReleaseForGraph(uintptr_t lo, uintptr_t hi) {
  ScopedInsideLazypin inside;
  pool_->Invalidate(lo, hi, EvictReason::kGraph);
}

namespace {
// Host memory nobody registers: the driver's answers about it are its
// answers about unregistered memory.
alignas(64) char g_unregistered[64];
}  // namespace

uintptr_t Dispatch::QueryAddress(uintptr_t ptr) {
  FreeCachedHostBlocks(ptr, ptr + 1, EvictReason::kQuery);
  if (pool_ == nullptr || !pool_->MaybeHolds(ptr, ptr + 1)) return ptr;
  ScopedInsideLazypin inside;
  return pool_->HoldsDeferred(ptr, ptr + 1) ? reinterpret_cast<uintptr_t>(g_unregistered) : ptr;
}

}  // namespace lazypin
