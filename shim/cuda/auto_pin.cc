// auto_pin: pinned speed for pageable copies (see auto_pin.h).
#include "auto_pin.h"

#include "capture.h"
#include "driver_calls.h"
#include "page_class.h"
#include "pages.h"
#include "thread_state.h"

namespace lazypin {
namespace {

// What the driver knows of the memory at `p`: nothing (pageable host memory,
// or no memory at all), or its type.
enum class Known { kNothing, kHost, kDevice };
Known Ask(uintptr_t p) {
  auto attribute = driver::PointerGetAttribute();
  if (attribute == nullptr) return Known::kHost;  // unknown: never pinned
  CUmemorytype type = CU_MEMORYTYPE_HOST;
  if (attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p) != CUDA_SUCCESS) return Known::kNothing;
  return type == CU_MEMORYTYPE_HOST ? Known::kHost : Known::kDevice;
}

// The other side of the copy is device memory (a host-to-host copy gains nothing).
bool IsDevice(const CopySide& side) {
  if (side.lo == 0) return true;
  return side.unified && Ask(side.lo) == Known::kDevice;
}

}  // namespace

AutoPinCopy AutoPin::Slow(const char* api, Via via, CopySide dst, CopySide src) {
  AutoPinCopy copy;
  if (t_state.inside > 0 || pool_->Abandoned()) return copy;
  // A capture in progress: the copy is recorded, not run, and a register may
  // be refused and invalidate the capture. Leave it to the driver.
  if (Captures().Any()) return copy;
  ScopedInsideLazypin inside;
  const Context ctx = env_->CurrentContext();
  if (ctx == nullptr) return copy;  // the copy fails (201) or cudart sets one up: not ours
  if (!seen_copy_.load(std::memory_order_relaxed) && !seen_copy_.exchange(true) &&
      sink_ != nullptr) {
    sink_->OnFirstCopy();
  }
  if (src.lo != 0 && src.bytes >= limits_.min_bytes) {
    copy = AutoPinCopy{PinSide(api, via, src, dst, /*to_device=*/true, ctx), true, src.bytes};
  }
  if (dst.lo != 0 && dst.bytes >= limits_.min_bytes) {
    const CopyRate rate = PinSide(api, via, dst, src, /*to_device=*/false, ctx);
    if (copy.rate == CopyRate::kNone) copy = AutoPinCopy{rate, false, dst.bytes};
  }
  if (copy.rate == CopyRate::kPinned) {
    pinned_rate_bytes_[copy.to_device ? 0 : 1].fetch_add(copy.bytes, std::memory_order_relaxed);
  }
  return copy;
}

void AutoPin::CopyTimed(const AutoPinCopy& copy, int64_t ns) {
  if (copy.rate == CopyRate::kNone) return;
  TimedCounters& t = timed_[copy.to_device ? 0 : 1][copy.rate == CopyRate::kPinned ? 1 : 0];
  t.copies.fetch_add(1, std::memory_order_relaxed);
  t.bytes.fetch_add(copy.bytes, std::memory_order_relaxed);
  t.ns.fetch_add(ns, std::memory_order_relaxed);
}

AutoPinCopyStats AutoPin::CopyStats() const {
  AutoPinCopyStats out;
  for (int d = 0; d < 2; ++d) {
    out.dir[d].pinned_rate_bytes = pinned_rate_bytes_[d].load(std::memory_order_relaxed);
    AutoPinCopyStats::Timed* into[2] = {&out.dir[d].pageable, &out.dir[d].pinned};
    for (int r = 0; r < 2; ++r) {
      into[r]->copies = timed_[d][r].copies.load(std::memory_order_relaxed);
      into[r]->bytes = timed_[d][r].bytes.load(std::memory_order_relaxed);
      into[r]->ns = timed_[d][r].ns.load(std::memory_order_relaxed);
    }
  }
  return out;
}

bool AutoPin::CountCopy(uintptr_t ptr, size_t bytes) {
  if (limits_.after <= 1) return true;
  std::lock_guard<std::mutex> lock(seen_mu_);
  for (Seen& s : seen_) {
    if (s.copies > 0 && s.ptr == ptr && s.bytes == bytes) {
      if (++s.copies < limits_.after) return false;
      s = Seen{};
      return true;
    }
  }
  seen_[seen_next_] = Seen{ptr, bytes, 1};
  seen_next_ = (seen_next_ + 1) % kSeen;
  return false;
}

CopyRate AutoPin::PinSide(const char* api, Via via, const CopySide& side, const CopySide& other,
                          bool to_device, Context ctx) {
  RegisterRequest req;
  req.ptr = side.lo;
  req.bytes = side.bytes;
  req.flags = 0;
  req.ctx = ctx;
  req.device = env_->DeviceOf(ctx);
  const uintptr_t hi = RangeEnd(side.lo, side.bytes);
  bool left_pageable = false;  // a copy before the `after`th, of memory the driver does not know
  const AutoPinOutcome out = pool_->AutoPin(
      req, limits_.max_bytes,
      [&] {
        // Then private anonymous pages only: shared and file-backed ones change
        // with no event. Memory the driver knows (pinned, device, managed)
        // is not pageable, and a host-to-host copy gains nothing.
        // The cost model's count first: only copies that would pin count.
        if (!CountCopy(side.lo, side.bytes)) {
          left_pageable = Ask(side.lo) == Known::kNothing && Ask(hi - 1) == Known::kNothing &&
                          IsDevice(other);
          return false;
        }
        return ClassifyRange(side.lo, hi) == PageClass::kPrivateAnonymous &&
               Ask(side.lo) == Known::kNothing && Ask(hi - 1) == Known::kNothing &&
               IsDevice(other);
      },
      [&] {
        auto reg = driver::MemHostRegister();
        if (reg == nullptr) return int{CUDA_ERROR_NOT_INITIALIZED};
        return int{reg(reinterpret_cast<void*>(side.lo), side.bytes, 0)};
      });
  if (out.attempted && sink_ != nullptr) {
    sink_->RecordAutoPin(
        AutoPinRecord{api, via, side.lo, side.bytes, to_device, out.driver_result, out.register_ns});
  }
  if (out.result == AutoPinResult::kPinned || out.result == AutoPinResult::kCovered) {
    return CopyRate::kPinned;
  }
  return left_pageable ? CopyRate::kPageable : CopyRate::kNone;
}

}  // namespace lazypin
