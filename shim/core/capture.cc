// capture: the stream captures in progress (see capture.h).
#include "capture.h"

namespace lazypin {

int CaptureTracker::Begin(uint64_t stream, Context ctx, CaptureMode mode, uint64_t thread) {
  std::lock_guard<std::mutex> lock(mu_);
  active_.fetch_add(1, std::memory_order_relaxed);
  for (int i = 0; i < kSlots; ++i) {
    if (!slots_[i].used) {
      slots_[i] = Slot{true, stream, ctx, mode, thread};
      return i;
    }
  }
  overflow_ += 1;
  return kOverflow;
}

void CaptureTracker::Refused(int handle) {
  std::lock_guard<std::mutex> lock(mu_);
  if (handle == kOverflow) {
    if (overflow_ == 0) return;
    overflow_ -= 1;
  } else {
    if (handle < 0 || handle >= kSlots || !slots_[handle].used) return;
    slots_[handle].used = false;
  }
  active_.fetch_sub(1, std::memory_order_relaxed);
}

void CaptureTracker::Ended(uint64_t stream) {
  if (!Any()) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (Slot& slot : slots_) {
    if (slot.used && slot.stream == stream) {
      slot.used = false;
      active_.fetch_sub(1, std::memory_order_relaxed);
      return;
    }
  }
  // Not in a slot: one of the overflow (or a capture begun before lazypin
  // was loaded, which was never counted).
  if (overflow_ > 0) {
    overflow_ -= 1;
    active_.fetch_sub(1, std::memory_order_relaxed);
  }
}

bool CaptureTracker::InProgress(Context ctx) const {
  if (!Any()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (overflow_ > 0) return true;
  for (const Slot& slot : slots_) {
    if (slot.used && slot.ctx == ctx) return true;
  }
  return false;
}

bool CaptureTracker::ForbidsUnsafeCall(uint64_t thread, CaptureMode thread_mode) const {
  if (!Any() || thread_mode == CaptureMode::kRelaxed) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (overflow_ > 0) return true;
  for (const Slot& slot : slots_) {
    if (!slot.used) continue;
    const bool own_strict = slot.thread == thread && slot.mode != CaptureMode::kRelaxed;
    if (own_strict) return true;
    if (thread_mode == CaptureMode::kGlobal && slot.mode == CaptureMode::kGlobal) return true;
  }
  return false;
}

namespace {
// Constant-initialized (every member's constructor is constexpr): ready before
// any constructor runs, as hooks may be called from the start.
CaptureTracker g_captures;
}  // namespace

CaptureTracker& Captures() { return g_captures; }

}  // namespace lazypin
