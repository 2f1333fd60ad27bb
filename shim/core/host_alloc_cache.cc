// host_alloc_cache: freed pinned host blocks kept for reuse (see host_alloc_cache.h).
#include "host_alloc_cache.h"

#include "absl/types/span.h"
#include "zero_fill.h"

#include <string.h>

#include <algorithm>

namespace lazypin {

namespace {
constexpr unsigned kDeviceMap = 0x02;  // CU_MEMHOSTALLOC_DEVICEMAP
}  // namespace

HostAllocCache::HostAllocCache(HostAllocDriver* driver, HostAllocObserver* observer,
                               HostAllocLimits limits)
    : driver_(driver), observer_(observer), limits_(limits) {}

void HostAllocCache::Uncache(uintptr_t base, Block& b) {
  auto [lo, hi] = index_.equal_range(KeyOf(b));
  for (auto it = lo; it != hi; ++it) {
    if (it->second == base) {
      index_.erase(it);
      auto kind = cached_kinds_.find({reinterpret_cast<uintptr_t>(b.ctx), b.flags});
      if (kind != cached_kinds_.end() && --kind->second == 0) cached_kinds_.erase(kind);
      break;
    }
  }
  lru_.erase(b.lru_key);
  counters_.cached_bytes -= Span(b.bytes);
  counters_.cached_entries -= 1;
}

bool HostAllocCache::OwnsItsPages(uintptr_t base, size_t bytes) {
  return base % 4096 == 0 && bytes >= kOwnPagesMin;
}

void HostAllocCache::Protect(uintptr_t base, size_t bytes, bool accessible) {
  if (OwnsItsPages(base, bytes)) driver_->Protect(base, Span(bytes), accessible);
}

HostAllocCache::Victim HostAllocCache::TakeVictim(uintptr_t base, Block& b, EvictReason reason) {
  Uncache(base, b);
  b.state = State::kReleasing;
  releasing_ += 1;
  return Victim{base, b.bytes, b.ctx, reason};
}

bool HostAllocCache::RangeQuiet(uintptr_t lo, uintptr_t hi) const {
  if (releasing_ == 0) return true;
  auto it = blocks_.upper_bound(lo);
  if (it != blocks_.begin()) --it;
  for (; it != blocks_.end() && it->first < hi; ++it) {
    if (it->second.state == State::kReleasing && it->first + Span(it->second.bytes) > lo) {
      return false;
    }
  }
  return true;
}

void HostAllocCache::AwaitQuiet(std::unique_lock<std::mutex>& lock, uintptr_t lo, uintptr_t hi) {
  released_.wait(lock, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return RangeQuiet(lo, hi); });
}

int HostAllocCache::Release(const Victim* victims, size_t count) {
  for (const Victim& v : absl::MakeConstSpan(victims, count)) {
    ReleaseWait wait;
    Protect(v.base, v.bytes, /*accessible=*/true);  // as the driver gave it
    const int64_t t0 = driver_->NowNs();
    const int result = driver_->Free(v.base, v.ctx, &wait);
    const int64_t latency = driver_->NowNs() - t0;
    if (observer_ != nullptr) observer_->OnHostRelease(v.base, v.bytes, v.reason, result, latency, wait);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(v.base);
    // A block the driver handed out again at that address meanwhile is live: keep it.
    if (it != blocks_.end() && it->second.state == State::kReleasing) blocks_.erase(it);
    releasing_ -= 1;
    AddHolding(-1);
    counters_.releases[static_cast<int>(v.reason)] += 1;
    if (wait.forced) counters_.forced_releases += 1;
  }
  if (count != 0) released_.notify_all();
  return static_cast<int>(count);
}

Outcome HostAllocCache::Alloc(const HostAllocRequest& request, void** out,
                              absl::FunctionRef<int()> forward) {
  if (out != nullptr && request.bytes != 0 && !Abandoned()) {
    uintptr_t served = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = index_.find(Key{request.bytes, request.flags, reinterpret_cast<uintptr_t>(request.ctx)});
      if (it != index_.end()) {
        served = it->second;
        Block& b = blocks_.find(served)->second;  // indexed blocks are tracked (no .at(): it throws)
        Uncache(served, b);
        Protect(served, b.bytes, /*accessible=*/true);
        b.state = State::kLive;
        b.device = request.device;
        counters_.hits += 1;
        AddHolding(-1);
      }
    }
    if (served != 0) {
      // A fresh block reads as zeros (the driver maps new pages): so does
      // this one, to the end of its last page where it has its pages alone.
      if (limits_.zero) {
        const int64_t t0 = driver_->NowNs();
        const size_t zeroed = OwnsItsPages(served, request.bytes) ? Span(request.bytes) : request.bytes;
        ZeroForProgram(reinterpret_cast<void*>(served), zeroed);
        const int64_t spent = driver_->NowNs() - t0;
        std::lock_guard<std::mutex> lock(mu_);
        counters_.zeroed_bytes += zeroed;
        counters_.zero_ns += spent;
      }
      *out = reinterpret_cast<void*>(served);
      return Outcome{kCudaSuccess, Action::kHit, 0};
    }
  }
  Outcome outcome{forward(), Action::kMiss, 0};
  if (outcome.result == kCudaOutOfMemory && MaybeHolds()) {
    // What the program freed would have been the driver's again: give it back.
    const int made_room = ReleaseAll(EvictReason::kMakeRoom);
    outcome.evicted += made_room;
    if (made_room > 0) outcome.result = forward();
  }
  if (outcome.result == kCudaSuccess && out != nullptr && *out != nullptr &&
      KeepsOtherFlags(request)) {
    outcome.evicted += Repack(request, out, forward, &outcome.result);
  }
  if (outcome.result == kCudaSuccess && out != nullptr && *out != nullptr && !Abandoned()) {
    std::lock_guard<std::mutex> lock(mu_);
    blocks_.insert_or_assign(reinterpret_cast<uintptr_t>(*out),
                             Block{request.bytes, request.flags, request.ctx, request.device,
                                   State::kLive, 0, 0});
    counters_.misses += 1;
  }
  return outcome;
}

bool HostAllocCache::KeepsOtherFlags(const HostAllocRequest& request) {
  if (!MaybeHolds()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [kind, count] : cached_kinds_) {
    if (kind.first == reinterpret_cast<uintptr_t>(request.ctx) && kind.second != request.flags) {
      return true;
    }
  }
  return false;
}

int HostAllocCache::Repack(const HostAllocRequest& request, void** out,
                           absl::FunctionRef<int()> forward, int* result) {
  unsigned reported = 0;
  const unsigned wanted = request.driver_flags() | kDeviceMap;
  if (!driver_->Flags(reinterpret_cast<uintptr_t>(*out), &reported) || reported == wanted) return 0;
  // Packed with a block kept under other flags: that block's flags show.
  // Free the new one, release those blocks, as the program's frees would
  // have, and allocate again.
  ReleaseWait wait;
  driver_->Free(reinterpret_cast<uintptr_t>(*out), request.ctx, &wait);
  const int released = ReleaseWhere(
      [&](const Block& b) { return b.ctx == request.ctx && b.flags != request.flags; },
      EvictReason::kFlags);
  *result = forward();
  return released;
}

Outcome HostAllocCache::Free(uintptr_t ptr, absl::FunctionRef<int()> forward,
                             absl::FunctionRef<bool()> may_keep) {
  if (Abandoned()) return Outcome{forward(), Action::kForward, 0};
  std::vector<Victim> victims;
  bool keepable = false;
  {
    std::unique_lock<std::mutex> lock(mu_);
    AwaitQuiet(lock, ptr, ptr + 1);
    auto it = blocks_.find(ptr);
    if (it != blocks_.end() && it->second.state == State::kCached) {
      // A second free: the driver answers it as for freed memory.
      victims.push_back(TakeVictim(it->first, it->second, EvictReason::kDoubleFree));
    } else if (it != blocks_.end()) {
      keepable = Span(it->second.bytes) <= limits_.max_bytes && limits_.max_entries > 0;
      if (!keepable) {
        blocks_.erase(it);
        counters_.forwarded_frees += 1;
      }
    }
  }
  if (!victims.empty()) {
    const int evicted = Release(victims);
    {
      std::lock_guard<std::mutex> lock(mu_);
      counters_.forwarded_frees += 1;
    }
    return Outcome{forward(), Action::kForward, evicted};
  }
  if (!keepable) return Outcome{forward(), Action::kForward, 0};
  // The implicit wait (or the reason not to keep) without the lock.
  const bool keep = (limits_.budget == nullptr || limits_.budget->MayKeep()) && may_keep();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(ptr);
    if (it != blocks_.end() && it->second.state == State::kCached) {
      // Another thread's free of this block kept it meanwhile (the program's
      // race): this one is a second free, which the driver answers once the
      // block is really freed.
      victims.push_back(TakeVictim(it->first, it->second, EvictReason::kDoubleFree));
      keepable = false;
    } else if (it == blocks_.end() || it->second.state != State::kLive) {
      // Freed by another thread meanwhile (the program's race): the driver decides.
      keepable = false;
    } else if (!keep) {
      blocks_.erase(it);
      keepable = false;
    } else {
      Block& b = it->second;
      b.state = State::kCached;
      b.lru_key = next_lru_key_++;
      b.freed_at = driver_->NowNs();
      Protect(ptr, b.bytes, /*accessible=*/false);  // before any thread can be served it
      index_.emplace(KeyOf(b), ptr);
      cached_kinds_[{reinterpret_cast<uintptr_t>(b.ctx), b.flags}] += 1;
      lru_.emplace(b.lru_key, ptr);
      counters_.cached_bytes += Span(b.bytes);
      counters_.cached_entries += 1;
      counters_.kept += 1;
      AddHolding(1);
      // Over a bound: the oldest other blocks go.
      while ((counters_.cached_bytes > limits_.max_bytes ||
              counters_.cached_entries > limits_.max_entries) &&
             !lru_.empty()) {
        const uintptr_t base = lru_.begin()->second;
        if (base == ptr) break;
        victims.push_back(TakeVictim(base, blocks_.find(base)->second, EvictReason::kLru));
      }
      counters_.peak_bytes = std::max(counters_.peak_bytes, counters_.cached_bytes);
      counters_.peak_entries = std::max(counters_.peak_entries, counters_.cached_entries);
    }
    if (!keepable) counters_.forwarded_frees += 1;
  }
  if (!keepable) {
    const int evicted = victims.empty() ? 0 : Release(victims);
    return Outcome{forward(), Action::kForward, evicted};
  }
  Release(victims);
  return Outcome{kCudaSuccess, Action::kDeferred, 0};
}

int HostAllocCache::Invalidate(uintptr_t lo, uintptr_t hi, EvictReason reason) {
  if (hi <= lo) return 0;
  std::vector<Victim> victims;
  {
    std::unique_lock<std::mutex> lock(mu_);
    AwaitQuiet(lock, lo, hi);
    auto it = blocks_.upper_bound(lo);
    if (it != blocks_.begin()) --it;
    for (; it != blocks_.end() && it->first < hi; ++it) {
      if (it->second.state == State::kCached && it->first + Span(it->second.bytes) > lo) {
        victims.push_back(TakeVictim(it->first, it->second, reason));
      }
    }
  }
  return Release(victims);
}

int HostAllocCache::ForgetWhere(absl::FunctionRef<bool(const Block&)> matches) {
  if (Abandoned()) return 0;
  std::lock_guard<std::mutex> lock(mu_);
  int forgotten = 0;
  for (auto it = blocks_.begin(); it != blocks_.end();) {
    Block& b = it->second;
    // A release in progress finishes on its own (the driver answers it).
    if (b.state == State::kReleasing || !matches(b)) {
      ++it;
      continue;
    }
    if (b.state == State::kCached) {
      Uncache(it->first, b);
      AddHolding(-1);
      counters_.forgotten += 1;
    }
    forgotten += 1;
    it = blocks_.erase(it);
  }
  return forgotten;
}

int HostAllocCache::ForgetContext(Context ctx) {
  return ForgetWhere([&](const Block& b) { return b.ctx == ctx; });
}

int HostAllocCache::ForgetDevice(int device) {
  return ForgetWhere([&](const Block& b) { return b.device == device; });
}

int HostAllocCache::ReleaseWhere(absl::FunctionRef<bool(const Block&)> matches,
                                 EvictReason reason) {
  if (Abandoned() || !MaybeHolds()) return 0;
  std::vector<Victim> victims;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [base, b] : blocks_) {
      if (b.state == State::kCached && matches(b)) victims.push_back(TakeVictim(base, b, reason));
    }
  }
  return Release(victims);
}

int HostAllocCache::CollectIdle(int64_t idle_ns) {
  const int64_t before = driver_->NowNs() - idle_ns;
  return ReleaseWhere([&](const Block& b) { return b.freed_at <= before; }, EvictReason::kIdle);
}

bool HostAllocCache::ReleaseOldest(EvictReason reason) {
  if (Abandoned() || !MaybeHolds()) return false;
  Victim victim[1];  // nothing allocated: this may run because memory ran out
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (lru_.empty()) return false;
    const uintptr_t base = lru_.begin()->second;
    victim[0] = TakeVictim(base, blocks_.find(base)->second, reason);
  }
  return Release(victim, 1) > 0;
}

int HostAllocCache::ReleaseAll(EvictReason reason) {
  return ReleaseWhere([](const Block&) { return true; }, reason);
}

HostAllocCounters HostAllocCache::Counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

}  // namespace lazypin
