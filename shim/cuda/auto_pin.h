// auto_pin: pinned speed for pageable copies (LAZYPIN_AUTOPIN).
// Before a host<->device copy whose host side is pageable, private anonymous
// memory of at least LAZYPIN_AUTOPIN_MIN bytes, lazypin registers that range
// through the pool (Pool::AutoPin) as an entry the program never registered:
// deferred, so pageable to the program. The copy, and later copies of the
// same range, then run at the pinned rate. Everything else the program sees
// stays the bare run's, by the paths that already serve deferred entries:
// async copies from or to it behave as pageable (a 1D host-to-device one is
// staged, hooks_driver.cc; others synchronize their stream, Dispatch::
// AfterAsyncCopy), pointer queries really unregister it first, a program
// register of it is a hit (exact) or evicts it first (overlap), fork, the
// memory hooks, the kernel watch and the idle collector release it.
//
// Contract: BeforeCopy is called by every copy hook (hooks_driver.cc) before
// the real copy, on the program's thread, never inside lazypin. It never
// registers while a stream capture is in progress (a register in a capture
// may be illegal, and the copy is recorded, not run), never with no current
// context, never over memory the program registered (any part of it), never
// past the bounds (it evicts nothing to make room), and never where the
// kernel watch is off (the shim then builds no AutoPin). A copy below the
// threshold costs one comparison.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "config.h"
#include "copy_sides.h"
#include "dispatch.h"
#include "pool.h"
#include "types.h"

namespace lazypin {

// No threshold below this is accepted (config.cc): copies under it never
// reach the auto-pin path, nor set lazypin up.
constexpr uint64_t kAutoPinFloor = uint64_t{64} << 10;

// No defaults of its own: AutoPinLimitsFrom fills it from Config.
struct AutoPinLimits {
  uint64_t min_bytes = 0;  // LAZYPIN_AUTOPIN_MIN
  uint64_t max_bytes = 0;  // LAZYPIN_AUTOPIN_BYTES: auto-pinned bytes held at once
  int after = 0;  // LAZYPIN_AUTOPIN_AFTER: pin at this copy of a range (1: the first)
};
inline AutoPinLimits AutoPinLimitsFrom(const Config& config) {
  AutoPinLimits limits;
  limits.min_bytes = config.autopin_min;
  limits.max_bytes = config.autopin_bytes;
  limits.after = static_cast<int>(config.autopin_after);
  return limits;
}


// One auto-pin, for the log ("autopin" record) and the statistics.
struct AutoPinRecord {
  const char* api;  // the copy's entry point, e.g. "cuMemcpyHtoD_v2"
  Via via;
  uintptr_t ptr;
  size_t bytes;
  bool to_device;      // the pinned side is the copy's source (host to device)
  int result;          // the register's answer (0: pinned)
  int64_t latency_ns;  // the register's cost
};

// What one copy was to auto-pin, for its time: a copy of a range it holds
// pinned (now or since an earlier copy), or a copy it left pageable before
// pinning the range at a later copy (LAZYPIN_AUTOPIN_AFTER of 2 or more);
// kNone: neither. Only synchronous copies are timed (CopyTimed): an async
// one returns before its bytes move.
enum class CopyRate : uint8_t { kNone, kPageable, kPinned };
struct AutoPinCopy {
  CopyRate rate = CopyRate::kNone;
  bool to_device = false;  // host to device (else device to host)
  size_t bytes = 0;        // the host side's span
};

// Per direction ([0]: host to device, [1]: device to host): the bytes of every
// copy that ran at the pinned rate (sync and async), and the synchronous
// copies timed, pageable and pinned: what prices auto-pin's saving at the
// rates of this run (AutoPinSavingOf, stats.h).
struct AutoPinCopyStats {
  struct Timed {
    uint64_t copies = 0, bytes = 0;
    int64_t ns = 0;
  };
  struct Direction {
    uint64_t pinned_rate_bytes = 0;
    Timed pageable, pinned;
  };
  Direction dir[2];
};

class AutoPinSink {
 public:
  virtual ~AutoPinSink() = default;
  virtual void RecordAutoPin(const AutoPinRecord& record) = 0;
  // Once, at the first copy seen with a current context (the program's CUDA
  // is set up by then): lazypin's exit handler may be installed.
  virtual void OnFirstCopy() {}
};

class AutoPin {
 public:
  AutoPin(Pool* pool, DispatchEnv* env, AutoPinSink* sink, AutoPinLimits limits)
      : pool_(pool), env_(env), sink_(sink), limits_(limits) {}
  AutoPin(const AutoPin&) = delete;
  AutoPin& operator=(const AutoPin&) = delete;

  // Before the real copy `api` (reached through `via`) from `src` to `dst`;
  // what the copy is to auto-pin, for CopyTimed.
  AutoPinCopy BeforeCopy(const char* api, Via via, CopySide dst, CopySide src) {
    if (dst.bytes < limits_.min_bytes && src.bytes < limits_.min_bytes) return AutoPinCopy{};
    return Slow(api, via, dst, src);
  }

  // A synchronous copy that BeforeCopy classed (rate not kNone) returned
  // success after `ns`. Lock-free; any thread.
  void CopyTimed(const AutoPinCopy& copy, int64_t ns);

  AutoPinCopyStats CopyStats() const;

  uint64_t min_bytes() const { return limits_.min_bytes; }

 private:
  AutoPinCopy Slow(const char* api, Via via, CopySide dst, CopySide src);
  CopyRate PinSide(const char* api, Via via, const CopySide& side, const CopySide& other,
                   bool to_device, Context ctx);
  // Counts a copy of [ptr, ptr + bytes) that could pin it; true at the
  // `after`th (copies of ranges seen less recently than the last kSeen are forgotten).
  bool CountCopy(uintptr_t ptr, size_t bytes);

  Pool* const pool_;
  DispatchEnv* const env_;
  AutoPinSink* const sink_;
  const AutoPinLimits limits_;
  std::atomic<bool> seen_copy_{false};
  // AutoPinCopyStats, as relaxed counters: [direction][0 pageable, 1 pinned].
  struct TimedCounters {
    std::atomic<uint64_t> copies{0}, bytes{0};
    std::atomic<int64_t> ns{0};
  };
  std::atomic<uint64_t> pinned_rate_bytes_[2] = {};
  TimedCounters timed_[2][2];
  static constexpr int kSeen = 64;
  struct Seen {
    uintptr_t ptr = 0;
    size_t bytes = 0;
    int copies = 0;
  };
  std::mutex seen_mu_;
  Seen seen_[kSeen];  // guarded by seen_mu_
  int seen_next_ = 0;  // guarded by seen_mu_
};

}  // namespace lazypin
