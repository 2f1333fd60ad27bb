// dispatch: one program call's path (see dispatch.h).
#include "dispatch.h"

#include <optional>

#include "thread_state.h"

namespace lazypin {

RegisterRequest Dispatch::Request(const ProgramCall& call, Context ctx) {
  RegisterRequest request;
  request.ptr = reinterpret_cast<uintptr_t>(call.ptr);
  request.bytes = call.bytes;
  request.flags = call.flags;
  request.ctx = ctx;
  request.device = env_->CurrentDevice();
  return request;
}

void Dispatch::Record(const ProgramCall& call, const Outcome& outcome, int64_t latency_ns) {
  ScopedInsideLazypin inside;
  env_->Record(CallRecord{call, outcome.result, latency_ns, outcome.action, outcome.evicted});
}

Outcome Dispatch::Act(const ProgramCall& call, absl::FunctionRef<int()> real) {
  if (pool_ == nullptr) return Outcome{real(), Action::kForward, 0};
  ScopedInsideLazypin inside;
  if (IsRegister(call.api)) return pool_->Register(Request(call, env_->CurrentContext()), real);
  return pool_->Unregister(reinterpret_cast<uintptr_t>(call.ptr), real,
                           /*may_defer=*/!env_->CaptureForbidsDeferral());
}

int Dispatch::Runtime(const ProgramCall& call, absl::FunctionRef<int()> real) {
  const int64_t t0 = env_->NowNs();
  // A hit or a deferral needs no driver call: take it here and spare the
  // program cudart's own path. A register needs the context cudart will use,
  // the current one (cudart uses it when there is one). Everything else goes
  // through cudart to the driver hook, so that cudart sees only the driver's
  // final answer (its last error too).
  std::optional<Outcome> fast;
  if (pool_ != nullptr) {
    ScopedInsideLazypin inside;
    if (IsRegister(call.api)) {
      if (Context ctx = env_->CurrentContext()) fast = pool_->TryHit(Request(call, ctx));
    } else if (!env_->CaptureForbidsDeferral()) {
      fast = pool_->TryDefer(reinterpret_cast<uintptr_t>(call.ptr));
    }
  }
  Outcome outcome;
  if (fast) {
    outcome = *fast;
  } else {
    RuntimeFrame frame;
    RuntimeFrame* const outer = t_state.runtime_frame;
    t_state.runtime_frame = &frame;
    const int result = real();
    t_state.runtime_frame = outer;
    outcome = frame.outcome;
    outcome.result = result;  // cudart's answer, whatever the driver said
  }
  Record(call, outcome, env_->NowNs() - t0);
  return outcome.result;
}

int Dispatch::Driver(const ProgramCall& call, absl::FunctionRef<int()> real) {
  if (RuntimeFrame* frame = t_state.runtime_frame) {
    // cudart on behalf of the runtime call above: act, report into its frame.
    t_state.runtime_frame = nullptr;  // a driver call made from inside this one is not cudart's
    const Outcome outcome = Act(call, real);
    t_state.runtime_frame = frame;
    frame->driver_calls += 1;
    frame->outcome.action = outcome.action;
    frame->outcome.evicted += outcome.evicted;
    return outcome.result;
  }
  const int64_t t0 = env_->NowNs();
  const Outcome outcome = Act(call, real);
  Record(call, outcome, env_->NowNs() - t0);
  return outcome.result;
}

void Dispatch::BeforeContextDestroy(Context ctx) {
  if (pool_ == nullptr) return;
  ScopedInsideLazypin inside;
  pool_->DropContext(ctx);
}

void Dispatch::BeforePrimaryContextReset(int device, bool forget_in_use) {
  if (pool_ == nullptr) return;
  ScopedInsideLazypin inside;
  pool_->DropDevice(device, forget_in_use);
}

void Dispatch::BeforeQuery(uintptr_t ptr) {
  if (pool_ == nullptr || !pool_->MaybeHolds(ptr, ptr + 1)) return;
  ScopedInsideLazypin inside;
  pool_->Invalidate(ptr, ptr + 1, EvictReason::kQuery);
}

}  // namespace lazypin
