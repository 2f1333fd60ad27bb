// driver_model: the CUDA driver's host-registration semantics as a plain
// model, and a harness that runs lazypin's Pool against it and checks every
// program-visible result and the pool's invariants after every step.
//
// Shared by the unit tests (pool_test, pool_property_test), the libFuzzer
// target and its replay driver (tests/fuzz), so the model exists once.
//
// The harness keeps three views:
//  - driver_:  what the (fake) driver really holds, reached by the pool;
//  - program_: the same semantics applied directly to the program's calls:
//              what the program would see WITHOUT lazypin;
//  - pooled_:  what the harness saw the pool defer (and not hit or evict yet).
// and checks, after every operation:
//  - each program call returned what program_ returned for it;
//  - driver_ ⊇ program_ (same base, bytes, flags, context);
//  - driver_ \ program_ == pooled_ (no leak, no unknown registration), and the
//    pool's counters agree (entries, bytes, bounds, hits, deferrals, evictions);
//  - the pool never evicts a registration the program still holds;
//  - after Invalidate(lo, hi) nothing in driver_ \ program_ overlaps [lo, hi);
//  - memory leaving the process (Invalidate with any reason but kQuery, after
//    MarkLeft, as MemoryGuard does) while the program holds a registration in
//    it: the program's unregister of that registration is never deferred;
//  - MaybeHolds is true for every pooled range (no false negative);
//  - with check_frames, a hit never hands back pages that changed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "pool.h"
#include "test_limits.h"

namespace lazypin {
namespace model {

// CUDA result codes (cudaError_t and CUresult agree on these).
constexpr int kInvalidValue = 1;
constexpr int kOutOfMemory = 2;
constexpr int kAlreadyRegistered = 712;
constexpr int kNotRegistered = 713;

constexpr uintptr_t kPage = 4096;

inline uintptr_t SatEnd(uintptr_t base, size_t bytes) {
  const uintptr_t end = base + bytes;
  return end < base ? ~uintptr_t{0} : end;
}

struct Registration {
  uintptr_t base = 0;
  size_t bytes = 0;
  unsigned flags = 0;
  Context ctx = nullptr;
  std::vector<uint64_t> frames;  // the pages pinned when it was registered
};

inline bool SameRegistration(const Registration& a, const Registration& b) {
  return a.base == b.base && a.bytes == b.bytes && a.flags == b.flags && a.ctx == b.ctx;
}

// The driver's semantics, exactly: registrations are byte ranges; a register
// overlapping a live one (at `granularity`: 1 = bytes, 4096 = pages) fails
// with 712; unregister of a base succeeds, of an interior pointer is invalid
// (1), of anything else is 713; null or zero is invalid; a register that would
// pin more than `capacity` bytes in all fails with out of memory (2).
class DriverModel {
 public:
  explicit DriverModel(uintptr_t granularity = 1, uint64_t capacity = ~uint64_t{0})
      : granularity_(granularity), capacity_(capacity) {}

  int Register(uintptr_t ptr, size_t bytes, unsigned flags, Context ctx,
               std::vector<uint64_t> frames = {}) {
    if (ptr == 0 || bytes == 0) return kInvalidValue;
    if (Overlaps(Floor(ptr), Ceil(SatEnd(ptr, bytes)))) return kAlreadyRegistered;
    if (bytes > capacity_ - registered_bytes_) return kOutOfMemory;
    regs_.emplace(ptr, Registration{ptr, bytes, flags, ctx, std::move(frames)});
    registered_bytes_ += bytes;
    return 0;
  }

  int Unregister(uintptr_t ptr) {
    if (ptr == 0) return kInvalidValue;
    auto it = Containing(ptr);
    if (it == regs_.end()) return kNotRegistered;
    if (it->first != ptr) return kInvalidValue;
    registered_bytes_ -= it->second.bytes;
    regs_.erase(it);
    return 0;
  }

  // A copy whose host side is [lo, hi): a side that starts inside a
  // registration (its granular range) and runs past it is refused (1); one
  // that starts in none is pageable (0).
  int Copy(uintptr_t lo, uintptr_t hi) const {
    auto it = regs_.upper_bound(lo);
    if (it == regs_.begin()) return 0;
    --it;
    const uintptr_t end = Ceil(SatEnd(it->first, it->second.bytes));
    return Floor(it->first) <= lo && lo < end && hi > end ? kInvalidValue : 0;
  }

  // A context is destroyed: its registrations vanish.
  void DropContext(Context ctx) {
    for (auto it = regs_.begin(); it != regs_.end();) {
      if (it->second.ctx == ctx) {
        registered_bytes_ -= it->second.bytes;
        it = regs_.erase(it);
      } else {
        ++it;
      }
    }
  }

  const Registration* Find(uintptr_t base) const {
    auto it = regs_.find(base);
    return it == regs_.end() ? nullptr : &it->second;
  }
  const std::map<uintptr_t, Registration>& regs() const { return regs_; }
  uint64_t registered_bytes() const { return registered_bytes_; }

 private:
  uintptr_t Floor(uintptr_t a) const { return a - a % granularity_; }
  uintptr_t Ceil(uintptr_t a) const {
    const uintptr_t r = a % granularity_;
    if (r == 0) return a;
    const uintptr_t up = a + (granularity_ - r);
    return up < a ? ~uintptr_t{0} : up;
  }
  // Any registration whose granular range meets [lo, hi)? (Granular ranges of
  // live registrations are disjoint, so only the predecessor can start below.)
  bool Overlaps(uintptr_t lo, uintptr_t hi) const {
    auto it = regs_.lower_bound(lo);
    if (it != regs_.begin()) {
      auto prev = std::prev(it);
      if (Ceil(SatEnd(prev->first, prev->second.bytes)) > lo) return true;
    }
    return it != regs_.end() && Floor(it->first) < hi;
  }
  std::map<uintptr_t, Registration>::iterator Containing(uintptr_t ptr) {
    auto it = regs_.upper_bound(ptr);
    if (it == regs_.begin()) return regs_.end();
    --it;
    return SatEnd(it->first, it->second.bytes) > ptr ? it : regs_.end();
  }

  uintptr_t granularity_;
  uint64_t capacity_;
  uint64_t registered_bytes_ = 0;
  std::map<uintptr_t, Registration> regs_;
};

// ---------------------------------------------------------------------------
// Operations, and where their randomness comes from (an RNG for the property
// test, the input bytes for the fuzzer): one generator serves both.

class OpSource {
 public:
  virtual ~OpSource() = default;
  // Uniform-ish in [0, n); n > 0.
  virtual uint64_t Next(uint64_t n) = 0;
  bool Chance(uint64_t one_in) { return Next(one_in) == 0; }
};

class RngSource final : public OpSource {
 public:
  explicit RngSource(uint64_t seed) : rng_(seed) {}
  uint64_t Next(uint64_t n) override { return rng_() % n; }

 private:
  std::mt19937_64 rng_;
};

class ByteSource final : public OpSource {
 public:
  ByteSource(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint64_t Next(uint64_t n) override {
    uint64_t v = 0;
    for (uint64_t range = 1; range < n && range != 0; range <<= 8) {
      v = (v << 8) | (pos_ < size_ ? data_[pos_] : 0);
      ++pos_;
    }
    return v % n;
  }
  bool exhausted() const { return pos_ >= size_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

enum class OpKind {
  kRegister, kUnregister, kInvalidate, kDropContext, kDropDevice, kCollectIdle, kReleaseAll,
  kAdvanceClock, kRemap, kAutoPin
};

struct Op {
  OpKind kind = OpKind::kRegister;
  uintptr_t ptr = 0;   // register/unregister pointer; invalidate/remap low end
  size_t bytes = 0;    // register size; invalidate/remap length
  unsigned flags = 0;
  int ctx = 0;         // context index (== device index)
  bool reset = false;  // kDropDevice: reset (forget in-use) rather than release
  int64_t ns = 0;      // kCollectIdle: idle threshold; kAdvanceClock: step
  EvictReason reason = EvictReason::kFree;
};

inline std::string OpString(const Op& op) {
  switch (op.kind) {
    case OpKind::kRegister:
      return absl::StrFormat("Register(0x%x, %d, flags=%d, ctx=%d)", op.ptr, op.bytes, op.flags,
                             op.ctx);
    case OpKind::kUnregister: return absl::StrFormat("Unregister(0x%x)", op.ptr);
    case OpKind::kInvalidate:
      return absl::StrFormat("Invalidate(0x%x, 0x%x, %s)", op.ptr, op.ptr + op.bytes,
                             EvictReasonName(op.reason));
    case OpKind::kDropContext: return absl::StrFormat("DropContext(%d)", op.ctx);
    case OpKind::kDropDevice:
      return absl::StrFormat("DropDevice(%d, %s)", op.ctx, op.reset ? "reset" : "release");
    case OpKind::kCollectIdle: return absl::StrFormat("CollectIdle(%d)", op.ns);
    case OpKind::kReleaseAll: return "ReleaseAll";
    case OpKind::kAdvanceClock: return absl::StrFormat("AdvanceClock(%d)", op.ns);
    case OpKind::kRemap:
      return absl::StrFormat("RemapSilently(0x%x, 0x%x)", op.ptr, op.ptr + op.bytes);
    case OpKind::kAutoPin:
      return absl::StrFormat("AutoPin(0x%x, %d, ctx=%d)", op.ptr, op.bytes, op.ctx);
  }
  return "?";
}

struct HarnessOptions {
  uintptr_t arena = 0x10000000;  // the small address space the ops play in
  size_t arena_bytes = 4 * kPage;
  uintptr_t granularity = 1;     // the driver's overlap granularity
  uint64_t capacity = ~uint64_t{0};  // bytes the driver can pin in all
  PoolLimits limits = DefaultPoolLimits();
  bool remaps = false;           // generate silent remaps (needs limits.check_frames)
  bool autopin = false;          // generate copies that auto-pin (Pool::AutoPin)
  uint64_t autopin_bytes = ~uint64_t{0};  // its own bound
};

inline Context ContextOf(int index) { return reinterpret_cast<Context>(uintptr_t{0xC0} + index); }

// Runs one Pool against a DriverModel and checks it against the program's view.
class PoolHarness final : private PoolDriver, private PoolObserver {
 public:
  explicit PoolHarness(const HarnessOptions& options)
      : options_(options),
        driver_(options.granularity, options.capacity),
        program_(options.granularity, options.capacity),
        pool_(static_cast<PoolDriver*>(this), static_cast<PoolObserver*>(this), options.limits) {}

  Pool& pool() { return pool_; }
  const DriverModel& driver() const { return driver_; }
  const DriverModel& program() const { return program_; }
  const HarnessOptions& options() const { return options_; }
  uint64_t hits() const { return hits_; }
  uint64_t deferrals() const { return deferred_; }
  uint64_t evictions() const { return evictions_total_; }
  uint64_t warnings() const { return warnings_; }
  const std::deque<Registration>& recent() const { return recent_; }

  // Runs `op`; returns "" or what went wrong.
  std::string Apply(const Op& op) {
    error_.clear();
    evicted_in_call_ = 0;
    switch (op.kind) {
      case OpKind::kRegister: DoRegister(op); break;
      case OpKind::kUnregister: DoUnregister(op); break;
      case OpKind::kInvalidate: {
        const uintptr_t lo = op.ptr, hi = SatEnd(op.ptr, op.bytes);
        if (op.reason != EvictReason::kQuery) {
          pool_.MarkLeft(lo, hi);
          for (const auto& [base, r] : program_.regs()) {
            if (lo < hi && base < hi && SatEnd(base, r.bytes) > lo) left_.insert(base);
          }
        }
        const int n = pool_.Invalidate(lo, hi, op.reason);
        Expect(n == evicted_in_call_, "Invalidate returned %d, evicted %d", n, evicted_in_call_);
        for (const auto& [base, p] : pooled_) {
          Expect(!(lo < hi && base < hi && SatEnd(base, p.bytes) > lo),
                 "stale: pooled 0x%x (+%d) overlaps the invalidated range", base, p.bytes);
        }
        break;
      }
      case OpKind::kDropContext: {
        const int n = pool_.DropContext(ContextOf(op.ctx));
        Expect(n == evicted_in_call_, "DropContext returned %d, evicted %d", n, evicted_in_call_);
        driver_.DropContext(ContextOf(op.ctx));  // the real destroy, after the hook
        program_.DropContext(ContextOf(op.ctx));
        for (const auto& [base, p] : pooled_) {
          Expect(p.ctx != ContextOf(op.ctx), "pooled 0x%x of a destroyed context survived", base);
        }
        break;
      }
      case OpKind::kDropDevice: {
        const int n = pool_.DropDevice(op.ctx, op.reset);
        Expect(n == evicted_in_call_, "DropDevice returned %d, evicted %d", n, evicted_in_call_);
        if (op.reset) {
          driver_.DropContext(ContextOf(op.ctx));
          program_.DropContext(ContextOf(op.ctx));
        }
        for (const auto& [base, p] : pooled_) {
          Expect(p.ctx != ContextOf(op.ctx), "pooled 0x%x of a dropped device survived", base);
        }
        break;
      }
      case OpKind::kCollectIdle: {
        idle_cutoff_ = now_ - op.ns;
        const int n = pool_.CollectIdle(op.ns);
        Expect(n == evicted_in_call_, "CollectIdle returned %d, evicted %d", n, evicted_in_call_);
        for (const auto& [base, p] : pooled_) {
          Expect(p.deferred_at > now_ - op.ns, "pooled 0x%x idle since %d survived (now %d)", base,
                 p.deferred_at, now_);
        }
        break;
      }
      case OpKind::kReleaseAll: {
        const int n = pool_.ReleaseAll(EvictReason::kExit);
        Expect(n == evicted_in_call_, "ReleaseAll returned %d, evicted %d", n, evicted_in_call_);
        Expect(pooled_.empty(), "ReleaseAll left %d pooled", pooled_.size());
        break;
      }
      case OpKind::kAdvanceClock: now_ += op.ns; break;
      case OpKind::kAutoPin: DoAutoPin(op); break;
      case OpKind::kRemap:
        // The pages change behind the hooks' back (a missed hook).
        for (uintptr_t p = op.ptr / kPage; p <= (SatEnd(op.ptr, op.bytes) - 1) / kPage; ++p) {
          generation_[p] += 1;
        }
        break;
    }
    if (error_.empty()) CheckInvariants();
    if (!error_.empty()) return absl::StrCat(OpString(op), ": ", error_);
    return "";
  }

  // The checks that hold between any two operations.
  void CheckInvariants() {
    for (const auto& [base, r] : program_.regs()) {
      const Registration* d = driver_.Find(base);
      Expect(d != nullptr && SameRegistration(*d, r),
             "the program's registration 0x%x (+%d) is not in the driver as registered", base,
             r.bytes);
    }
    uint64_t extra_entries = 0, extra_bytes = 0;
    for (const auto& [base, d] : driver_.regs()) {
      const Registration* p = program_.Find(base);
      if (p != nullptr && SameRegistration(*p, d)) continue;
      extra_entries += 1;
      extra_bytes += d.bytes;
      auto it = pooled_.find(base);
      Expect(it != pooled_.end() && SameRegistration(it->second, d),
             "leak: the driver holds 0x%x (+%d) that neither the program nor the pool holds",
             base, d.bytes);
      Expect(pool_.MaybeHolds(base, SatEnd(base, d.bytes)),
             "MaybeHolds(0x%x) is false for a pooled registration", base);
    }
    Expect(extra_entries == pooled_.size(), "driver has %d beyond the program, pooled %d",
           extra_entries, pooled_.size());
    const PoolCounters c = pool_.Counters();
    Expect(c.pooled_entries == extra_entries && c.pooled_bytes == extra_bytes,
           "counters say %d pooled (%d bytes), the driver %d (%d bytes)", c.pooled_entries,
           c.pooled_bytes, extra_entries, extra_bytes);
    Expect(c.pooled_entries <= options_.limits.max_entries &&
               c.pooled_bytes <= options_.limits.max_bytes,
           "over bounds: %d entries, %d bytes", c.pooled_entries, c.pooled_bytes);
    Expect(c.peak_entries >= c.pooled_entries && c.peak_bytes >= c.pooled_bytes, "peak below now");
    Expect(pool_.Empty() == pooled_.empty(), "Empty() is %d with %d pooled", pool_.Empty(),
           pooled_.size());
    Expect(c.hits == hits_ && c.deferred == deferred_, "counters: %d hits %d deferred, seen %d %d",
           c.hits, c.deferred, hits_, deferred_);
    for (int r = 0; r < static_cast<int>(EvictReason::kCount); ++r) {
      Expect(c.evictions[r] == evictions_[r], "evictions[%s]: counter %d, seen %d",
             EvictReasonName(static_cast<EvictReason>(r)), c.evictions[r], evictions_[r]);
    }
  }

  // One random operation, biased towards collisions: re-registering recent
  // ranges (exactly or nearly), unregistering live ones, invalidating near them.
  Op MakeOp(OpSource& src) const {
    Op op;
    const uintptr_t arena = options_.arena;
    const size_t size = options_.arena_bytes;
    const uint64_t k = src.Next(100);
    const auto random_ptr = [&] {
      static constexpr uintptr_t kAlign[] = {1, 8, 64, 512, kPage};
      const uintptr_t align = kAlign[src.Next(5)];
      return arena + (src.Next(size) / align) * align;
    };
    const auto random_bytes = [&]() -> size_t {
      switch (src.Next(6)) {
        case 0: return 1 + src.Next(64);
        case 1: return kPage;
        case 2: return kPage - 16 + src.Next(32);
        case 3: return 2 * kPage;
        case 4: return src.Next(50) == 0 ? 0 : 1 + src.Next(2 * kPage);
        default: return 1 + src.Next(kPage / 2);
      }
    };
    if (options_.autopin && k < 40 && src.Next(3) == 0) {
      // A copy of a range: often one the program registered or had registered.
      op.kind = OpKind::kAutoPin;
      op.ctx = static_cast<int>(src.Next(2));
      if (!recent_.empty() && src.Next(2) == 0) {
        const Registration& r = recent_[src.Next(recent_.size())];
        op.ptr = r.base;
        op.bytes = r.bytes;
        op.ctx = r.ctx == ContextOf(1) ? 1 : 0;
        if (src.Next(4) == 0) op.ptr += src.Next(33) - 16;
      } else {
        op.ptr = random_ptr();
        op.bytes = random_bytes();
      }
    } else if (k < 40) {
      op.kind = OpKind::kRegister;
      if (!recent_.empty() && src.Next(2) == 0) {
        const Registration& r = recent_[src.Next(recent_.size())];
        op.ptr = r.base;
        op.bytes = r.bytes;
        op.flags = r.flags;
        op.ctx = r.ctx == ContextOf(1) ? 1 : 0;
        switch (src.Next(8)) {  // mostly exact, sometimes one field differs
          case 0:
            op.bytes = static_cast<size_t>(std::max<int64_t>(
                1, static_cast<int64_t>(op.bytes) + static_cast<int64_t>(src.Next(65)) - 32));
            break;
          case 1: op.flags ^= 1u << src.Next(4); break;
          case 2: op.ctx ^= 1; break;
          case 3: op.ptr += src.Next(33) - 16; break;
          default: break;
        }
      } else {
        op.ptr = src.Next(100) == 0 ? 0 : random_ptr();
        op.bytes = random_bytes();
        op.flags = src.Next(4) == 0 ? static_cast<unsigned>(src.Next(16)) : 0;
        op.ctx = static_cast<int>(src.Next(2));
      }
    } else if (k < 72) {
      op.kind = OpKind::kUnregister;
      const uint64_t pick = src.Next(20);
      const auto& live = program_.regs();
      if (pick < 12 && !live.empty()) {
        auto it = live.begin();
        std::advance(it, src.Next(live.size()));
        op.ptr = it->first;
      } else if (pick < 15 && !recent_.empty()) {
        op.ptr = recent_[src.Next(recent_.size())].base;  // maybe unregistered already
      } else if (pick < 17 && !live.empty()) {
        auto it = live.begin();
        std::advance(it, src.Next(live.size()));
        op.ptr = it->first + (it->second.bytes > 1 ? 1 + src.Next(it->second.bytes - 1) : 0);
      } else if (pick < 19) {
        op.ptr = random_ptr();
      } else {
        op.ptr = 0;
      }
    } else if (k < 82) {
      op.kind = OpKind::kInvalidate;
      static constexpr EvictReason kReasons[] = {
          EvictReason::kFree,  EvictReason::kRealloc, EvictReason::kMunmap, EvictReason::kMremap,
          EvictReason::kMmapFixed, EvictReason::kMadvise, EvictReason::kBrk,
          EvictReason::kShmdt, EvictReason::kShmat,   EvictReason::kQuery};
      op.reason = kReasons[src.Next(10)];
      if (!pooled_.empty() && src.Next(2) == 0) {
        auto it = pooled_.begin();
        std::advance(it, src.Next(pooled_.size()));
        // Around a pooled one: a sub-range, an edge, or the page-sharing neighbourhood.
        const uintptr_t lo = it->first - std::min<uintptr_t>(it->first - arena, src.Next(kPage));
        op.ptr = lo;
        op.bytes = 1 + src.Next(it->first - lo + it->second.bytes + kPage);
      } else if (src.Next(2) == 0) {
        op.ptr = arena + src.Next(size / kPage) * kPage;  // munmap-like: whole pages
        op.bytes = (1 + src.Next(2)) * kPage;
      } else {
        op.ptr = random_ptr();
        op.bytes = random_bytes();
      }
    } else if (k < 88) {
      op.kind = OpKind::kAdvanceClock;
      op.ns = static_cast<int64_t>(src.Next(5'000'000));
    } else if (k < 92) {
      op.kind = OpKind::kCollectIdle;
      op.ns = static_cast<int64_t>(src.Next(10'000'000));
    } else if (k < 94) {
      op.kind = OpKind::kDropContext;
      op.ctx = static_cast<int>(src.Next(2));
    } else if (k < 96) {
      op.kind = OpKind::kDropDevice;
      op.ctx = static_cast<int>(src.Next(2));
      op.reset = src.Next(2) == 0;
    } else if (k < 97) {
      op.kind = OpKind::kReleaseAll;
    } else if (options_.remaps) {
      op.kind = OpKind::kRemap;
      op.ptr = arena + src.Next(size / kPage) * kPage;
      op.bytes = kPage;
    } else {
      op.kind = OpKind::kAdvanceClock;
      op.ns = static_cast<int64_t>(src.Next(1000));
    }
    return op;
  }

 private:
  struct Pooled : Registration {
    uint64_t seq = 0;  // deferral order, for LRU
    int64_t deferred_at = 0;
  };

  template <typename... Args>
  void Expect(bool ok, const absl::FormatSpec<Args...>& format, const Args&... args) {
    if (!ok && error_.empty()) error_ = absl::StrFormat(format, args...);
  }

  std::vector<uint64_t> FramesNow(uintptr_t ptr, size_t bytes) const {
    std::vector<uint64_t> frames;
    if (ptr == 0 || bytes == 0 || bytes > 64 * options_.arena_bytes) return frames;
    for (uintptr_t p = ptr / kPage; p <= (SatEnd(ptr, bytes) - 1) / kPage; ++p) {
      auto it = generation_.find(p);
      frames.push_back((p << 16) | (it == generation_.end() ? 0 : it->second));
    }
    return frames;
  }

  void Remember(const Registration& r) {
    for (const Registration& x : recent_) {
      if (SameRegistration(x, r)) return;
    }
    recent_.push_back(Registration{r.base, r.bytes, r.flags, r.ctx, {}});
    if (recent_.size() > 12) recent_.pop_front();
  }

  void DoRegister(const Op& op) {
    RegisterRequest req;
    req.ptr = op.ptr;
    req.bytes = op.bytes;
    req.flags = op.flags;
    req.ctx = ContextOf(op.ctx);
    req.device = op.ctx;
    int forwards = 0;
    const Outcome out = pool_.Register(req, [&] {
      forwards += 1;
      return driver_.Register(req.ptr, req.bytes, req.flags, req.ctx, FramesNow(req.ptr, req.bytes));
    });
    const int expected = program_.Register(req.ptr, req.bytes, req.flags, req.ctx);
    Expect(out.result == expected, "result %d, without lazypin %d", out.result, expected);
    if (expected == 0) left_.erase(req.ptr);  // a new registration: its memory is here
    Expect(out.evicted == evicted_in_call_, "evicted says %d, observed %d", out.evicted,
           evicted_in_call_);
    if (out.action == Action::kHit) {
      hits_ += 1;
      Expect(forwards == 0 && out.evicted == 0, "a hit called the driver");
      auto it = pooled_.find(req.ptr);
      Expect(it != pooled_.end() && it->second.bytes == req.bytes &&
                 it->second.flags == req.flags && it->second.ctx == req.ctx,
             "a hit without an exact pooled match");
      if (it != pooled_.end()) pooled_.erase(it);
      if (options_.limits.check_frames) {
        const Registration* d = driver_.Find(req.ptr);
        Expect(d != nullptr && d->frames == FramesNow(req.ptr, req.bytes),
               "a hit handed back pages that changed (stale registration)");
      }
    } else {
      Expect(forwards >= 1 && forwards <= 2, "forwarded %d times", forwards);
    }
    if (out.result == 0) Remember(Registration{req.ptr, req.bytes, req.flags, req.ctx, {}});
  }

  // A copy about to use [ptr, ptr + bytes), as the copy hooks make it: the
  // pool first lets go of what it keeps there that the copy covers in part
  // (BeforeCopy, where MaybeHolds says so), then may register the range for
  // itself (a deferred entry the program never made) or touch the one holding
  // it. The driver then answers the copy as without lazypin.
  void DoAutoPin(const Op& op) {
    if (op.bytes != 0) {
      const uintptr_t lo = op.ptr, hi = SatEnd(op.ptr, op.bytes);
      if (pool_.MaybeHolds(lo, hi)) pool_.BeforeCopy(lo, hi);
      // Inside one registration the driver holds (the program's or kept): that
      // one answers. Else nothing kept may share a page with the copy.
      bool inside_one = false;
      for (const auto& [base, r] : driver_.regs()) {
        inside_one |= base <= lo && SatEnd(base, r.bytes) >= hi;
      }
      for (const auto& [base, p] : pooled_) {
        const bool shares_page = base < (hi + kPage - 1) / kPage * kPage &&
                                 SatEnd(base, p.bytes) > lo / kPage * kPage;
        Expect(inside_one || !shares_page, "a copy of 0x%x (+%d) covers pooled 0x%x (+%d) in part",
               lo, op.bytes, base, p.bytes);
      }
      evicted_in_call_ = 0;
    }
    PinForCopy(op);
    if (op.bytes != 0) {
      const uintptr_t lo = op.ptr, hi = SatEnd(op.ptr, op.bytes);
      const int got = driver_.Copy(lo, hi), bare = program_.Copy(lo, hi);
      Expect(got == bare, "the copy of 0x%x (+%d) gets %d, without lazypin %d", lo, op.bytes,
             got, bare);
    }
  }
  void PinForCopy(const Op& op) {
    RegisterRequest req;
    req.ptr = op.ptr;
    req.bytes = op.bytes;
    req.flags = 0;
    req.ctx = ContextOf(op.ctx);
    req.device = op.ctx;
    int registers = 0;
    const AutoPinOutcome out = pool_.AutoPin(
        req, options_.autopin_bytes, [] { return true; },
        [&] {
          registers += 1;
          return driver_.Register(req.ptr, req.bytes, 0, req.ctx, FramesNow(req.ptr, req.bytes));
        });
    Expect(evicted_in_call_ == 0 || out.result != AutoPinResult::kCovered,
           "a covered copy evicted %d", evicted_in_call_);
    const uintptr_t lo = req.ptr, hi = SatEnd(req.ptr, req.bytes);
    if (out.result == AutoPinResult::kPinned) {
      Expect(registers == 1, "pinned with %d registers", registers);
      for (const auto& [base, r] : program_.regs()) {
        const uintptr_t page_lo = lo / kPage * kPage, page_hi = (hi + kPage - 1) / kPage * kPage;
        Expect(!(base < page_hi && SatEnd(base, r.bytes) > page_lo),
               "auto-pinned 0x%x (+%d) over the program's 0x%x", lo, req.bytes, base);
      }
      Pooled p;
      static_cast<Registration&>(p) = Registration{req.ptr, req.bytes, 0, req.ctx, {}};
      p.seq = next_seq_++;
      p.deferred_at = now_;
      pooled_[req.ptr] = p;
      Remember(Registration{req.ptr, req.bytes, 0, req.ctx, {}});
    } else if (out.result == AutoPinResult::kCovered) {
      Expect(registers == 0, "a covered copy registered");
      bool found = false;
      for (auto& [base, p] : pooled_) {
        if (p.ctx == req.ctx && base <= lo && SatEnd(base, p.bytes) >= hi) {
          p.seq = next_seq_++;  // touched: most recently used, not idle
          p.deferred_at = now_;
          found = true;
          break;
        }
      }
      Expect(found, "covered, but no pooled entry of the context holds 0x%x (+%d)", lo, req.bytes);
    } else if (out.attempted) {
      Expect(out.driver_result != 0, "skipped after a successful register");
    }
  }

  void DoUnregister(const Op& op) {
    const Registration* before = program_.Find(op.ptr);
    const Registration copy = before != nullptr ? *before : Registration{};
    int forwards = 0;
    const Outcome out = pool_.Unregister(op.ptr, [&] {
      forwards += 1;
      return driver_.Unregister(op.ptr);
    });
    const int expected = program_.Unregister(op.ptr);
    Expect(out.result == expected, "result %d, without lazypin %d", out.result, expected);
    Expect(out.evicted == evicted_in_call_, "evicted says %d, observed %d", out.evicted,
           evicted_in_call_);
    const bool left = before != nullptr && left_.count(op.ptr) != 0;
    if (before != nullptr && expected == 0) left_.erase(op.ptr);
    Expect(!(left && out.action == Action::kDeferred),
           "deferred 0x%x, whose memory left the process while registered", op.ptr);
    if (out.action == Action::kDeferred) {
      deferred_ += 1;
      Expect(forwards == 0 && before != nullptr, "a deferral called the driver or had no entry");
      Pooled p;
      static_cast<Registration&>(p) = copy;
      p.seq = next_seq_++;
      p.deferred_at = now_;
      pooled_[op.ptr] = p;
    } else {
      Expect(forwards == 1, "forwarded %d times", forwards);
    }
  }

  // PoolDriver: the pool's own unregisters (evictions).
  int Unregister(uintptr_t ptr, Context ctx, ReleaseWait*) override {
    const Registration* live = program_.Find(ptr);
    Expect(live == nullptr, "the pool evicted 0x%x, which the program still holds", ptr);
    const Registration* d = driver_.Find(ptr);
    Expect(d == nullptr || d->ctx == ctx, "evicted 0x%x in the wrong context", ptr);
    const int result = driver_.Unregister(ptr);
    Expect(result == 0, "the driver refused the eviction of 0x%x: %d", ptr, result);
    return result;
  }
  bool ReadFrames(uintptr_t ptr, size_t bytes, std::vector<uint64_t>* frames) override {
    *frames = FramesNow(ptr, bytes);
    return true;
  }
  int64_t NowNs() override { return now_; }

  // PoolObserver.
  void OnEvict(uintptr_t ptr, size_t bytes, EvictReason reason, int result, int64_t,
               const ReleaseWait&) override {
    evicted_in_call_ += 1;
    evictions_total_ += 1;
    evictions_[static_cast<int>(reason)] += 1;
    auto it = pooled_.find(ptr);
    Expect(it != pooled_.end() && it->second.bytes == bytes,
           "evicted 0x%x (+%d), which was not pooled", ptr, bytes);
    if (it == pooled_.end()) return;
    if (reason == EvictReason::kIdle) {
      Expect(it->second.deferred_at <= idle_cutoff_, "idle evicted 0x%x deferred at %d, after %d",
             ptr, it->second.deferred_at, idle_cutoff_);
    }
    if (reason == EvictReason::kLru || reason == EvictReason::kIdle) {
      for (const auto& [base, p] : pooled_) {
        Expect(p.seq >= it->second.seq, "%s evicted 0x%x before the older 0x%x",
               EvictReasonName(reason), ptr, base);
      }
    }
    pooled_.erase(it);
  }
  void OnWarning(const std::string&) override { warnings_ += 1; }

  HarnessOptions options_;
  DriverModel driver_;
  DriverModel program_;
  Pool pool_;
  std::map<uintptr_t, Pooled> pooled_;
  std::set<uintptr_t> left_;  // program registrations whose memory left the process
  std::deque<Registration> recent_;
  std::map<uintptr_t, uint64_t> generation_;  // page -> remap count
  int64_t now_ = 1'000'000'000;
  int64_t idle_cutoff_ = 0;  // of the CollectIdle in progress
  uint64_t next_seq_ = 0;
  uint64_t hits_ = 0, deferred_ = 0, warnings_ = 0, evictions_total_ = 0;
  uint64_t evictions_[static_cast<int>(EvictReason::kCount)] = {};
  int evicted_in_call_ = 0;
  std::string error_;
};

// Runs `ops` operations from `src` (stopping early if `stop` says so); returns
// "" or the first failure, with the operations that led to it.
template <typename Stop>
std::string RunOps(PoolHarness& h, OpSource& src, int ops, Stop stop) {
  std::deque<std::string> trail;
  for (int i = 0; i < ops && !stop(); ++i) {
    const Op op = h.MakeOp(src);
    trail.push_back(OpString(op));
    if (trail.size() > 16) trail.pop_front();
    std::string error = h.Apply(op);
    if (!error.empty()) {
      std::string out = absl::StrCat("step ", i, ": ", error, "\n  last operations:");
      for (const std::string& t : trail) absl::StrAppend(&out, "\n    ", t);
      return out;
    }
  }
  return "";
}

}  // namespace model
}  // namespace lazypin
