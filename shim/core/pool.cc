// pool: the policy (see pool.h for the invariants).
#include "pool.h"

#include <algorithm>
#include <iterator>

#include "absl/types/span.h"
#include "fmt/format.h"
#include "memory_budget.h"
#include "pages.h"

namespace lazypin {
Pool::Pool(PoolDriver* driver, PoolObserver* observer, PoolLimits limits)
    : driver_(driver), observer_(observer), limits_(limits) {}

Pool::Map::iterator Pool::FirstOverlap(uintptr_t lo) {
  auto it = entries_.upper_bound(lo);
  if (it != entries_.begin()) {
    auto prev = std::prev(it);
    if (RangeEnd(prev->second.base, prev->second.bytes) > lo) return prev;
  }
  return it;
}

bool Pool::RangeQuiet(uintptr_t lo, uintptr_t hi) const {
  if (inflight_.empty() && evicting_ == 0) return true;
  for (const Inflight& r : inflight_) {
    if (PageFloor(r.bytes.lo) < hi && PageCeil(r.bytes.hi) > lo) return false;
  }
  auto& self = const_cast<Pool&>(*this);
  for (auto it = self.FirstOverlap(lo); it != self.entries_.end() && it->first < hi; ++it) {
    if (it->second.state == State::kEvicting) return false;
  }
  return true;
}

bool Pool::InflightLeftLocked(Range bytes) const {
  for (const Inflight& r : inflight_) {
    if (r.bytes.lo == bytes.lo && r.bytes.hi == bytes.hi) return r.left;
  }
  return false;
}

void Pool::MarkInflightLeftLocked(uintptr_t lo, uintptr_t hi) {
  for (Inflight& r : inflight_) {
    if (r.bytes.lo < hi && r.bytes.hi > lo) r.left = true;
  }
}

void Pool::BeginInflight(Range bytes) {
  inflight_.push_back(Inflight{bytes, false});
  in_use_filter_.Add(bytes.lo, bytes.hi);
  in_use_.fetch_add(1, std::memory_order_relaxed);
}

void Pool::EndInflight(Range bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = inflight_.begin(); it != inflight_.end(); ++it) {
      if (it->bytes.lo == bytes.lo && it->bytes.hi == bytes.hi) {
        in_use_filter_.Remove(bytes.lo, bytes.hi);
        inflight_.erase(it);
        in_use_.fetch_sub(1, std::memory_order_relaxed);
        break;
      }
    }
  }
  evicted_.notify_all();
}

void Pool::AwaitQuiet(std::unique_lock<std::mutex>& lock, uintptr_t lo, uintptr_t hi) {
  evicted_.wait(lock, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return RangeQuiet(lo, hi); });
}

void Pool::TrackInUse(const Entry& e) {
  if (e.state != State::kInUse || e.left) return;
  in_use_filter_.Add(e.base, RangeEnd(e.base, e.bytes));
  in_use_.fetch_add(1, std::memory_order_relaxed);
}

void Pool::UntrackInUse(const Entry& e) {
  if (e.state != State::kInUse || e.left) return;
  in_use_filter_.Remove(e.base, RangeEnd(e.base, e.bytes));
  in_use_.fetch_sub(1, std::memory_order_relaxed);
}

void Pool::MarkDeferred(Entry& e) {
  UntrackInUse(e);
  e.state = State::kDeferred;
  e.lru_key = next_lru_key_++;
  e.deferred_at = driver_->AgeClockNs();
  lru_.emplace(e.lru_key, e.base);
  filter_.Add(e.base, RangeEnd(e.base, e.bytes));
  holding_.fetch_add(1, std::memory_order_relaxed);
  counters_.pooled_bytes += e.bytes;
  counters_.pooled_entries += 1;
  counters_.peak_bytes = std::max(counters_.peak_bytes, counters_.pooled_bytes);
  counters_.peak_entries = std::max(counters_.peak_entries, counters_.pooled_entries);
}

// Leaves kDeferred for kInUse (a hit) or kEvicting; the filter and holding_
// count follow the entry until it is erased when it becomes kEvicting.
void Pool::UnmarkDeferred(Entry& e) {
  lru_.erase(e.lru_key);
  counters_.pooled_bytes -= e.bytes;
  counters_.pooled_entries -= 1;
  if (e.auto_pinned) {
    counters_.autopinned_bytes -= e.bytes;
    e.auto_pinned = false;
  }
}

Pool::Map::iterator Pool::Erase(Map::iterator it) {
  if (it->second.state == State::kDeferred || it->second.state == State::kEvicting) {
    filter_.Remove(it->second.base, RangeEnd(it->second.base, it->second.bytes));
    holding_.fetch_sub(1, std::memory_order_relaxed);
  }
  if (it->second.state == State::kEvicting) evicting_ -= 1;
  UntrackInUse(it->second);
  return entries_.erase(it);  // a btree erase invalidates every other iterator
}

void Pool::TakeVictim(Entry& e, EvictReason reason, std::vector<Victim>* victims) {
  victims->push_back(TakeVictim(e, reason));
}

Pool::Victim Pool::TakeVictim(Entry& e, EvictReason reason) {
  // A graph copies it: pinned again, the next launch would release it again.
  if (e.auto_pinned && reason == EvictReason::kGraph) NoteQueried(e.base, e.bytes, kAutoPinQueryLimit);
  const bool parked = UnparkLocked(e);
  UnmarkDeferred(e);
  e.state = State::kEvicting;
  evicting_ += 1;
  counters_.evictions[static_cast<int>(reason)] += 1;
  return Victim{e.base, e.bytes, e.ctx, reason, e.watched, parked};
}

void Pool::TakeOverBounds(std::vector<Victim>* victims) {
  while (!lru_.empty() && (counters_.pooled_bytes > limits_.max_bytes ||
                           counters_.pooled_entries > limits_.max_entries)) {
    auto it = entries_.find(lru_.begin()->second);
    TakeVictim(it->second, EvictReason::kLru, victims);
  }
}

int Pool::Evict(std::vector<Victim>& victims) { return Evict(victims.data(), victims.size()); }

int Pool::Evict(const Victim* victims, size_t count) {
  if (count == 0) return 0;
  uint64_t forced = 0;
  Context waited = nullptr;  // the context the previous release waited for
  for (const Victim& v : absl::MakeConstSpan(victims, count)) {
    const int64_t t0 = driver_->NowNs();
    ReleaseWait wait;
    wait.after_wait = waited != nullptr && waited == v.ctx;
    const int result = driver_->Unregister(v.base, v.ctx, &wait);
    waited = wait.forced ? nullptr : v.ctx;
    forced += wait.forced ? 1 : 0;
    if (observer_ != nullptr) {
      observer_->OnEvict(v.base, v.bytes, v.reason, result, driver_->NowNs() - t0, wait);
    }
    if (v.watched) driver_->Release(v.base, RangeEnd(v.base, v.bytes));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    counters_.forced_releases += forced;
    for (const Victim& v : absl::MakeConstSpan(victims, count)) {
      auto it = entries_.find(v.base);
      if (it != entries_.end() && it->second.state == State::kEvicting) Erase(it);
    }
  }
  evicted_.notify_all();
  // Unregistered, unwatched and forgotten: the parked blocks go back to the
  // allocator only now (its free may unmap them).
  for (const Victim& v : absl::MakeConstSpan(victims, count)) {
    if (v.parked) FreeParked(v.base);
  }
  return static_cast<int>(count);
}

bool Pool::FramesUnchanged(const Entry& e) {
  std::vector<uint64_t> now;
  if (!driver_->ReadFrames(e.base, e.bytes, &now)) return true;  // unknowable: trust the hooks
  return now == e.frames;
}

const Pool::Entry* Pool::HitLocked(const RegisterRequest& req) {
  auto it = entries_.find(req.ptr);
  if (it == entries_.end()) return nullptr;
  Entry& e = it->second;
  // A parked block is memory the program freed: registering it is the driver's affair.
  if (e.state != State::kDeferred || e.parked != 0 || e.bytes != req.bytes ||
      e.flags != req.flags || e.ctx != req.ctx) {
    return nullptr;
  }
  if (limits_.check_frames && !FramesUnchanged(e)) return nullptr;  // Register() says why
  if (e.auto_pinned) counters_.autopin_hits += 1;
  UnmarkDeferred(e);
  filter_.Remove(e.base, RangeEnd(e.base, e.bytes));
  holding_.fetch_sub(1, std::memory_order_relaxed);
  e.state = State::kInUse;
  e.left = false;
  TrackInUse(e);
  counters_.hits += 1;
  return &e;
}

void Pool::ApplyPageChanges(DrainScope scope) {
  if (abandoned_.load(std::memory_order_relaxed)) return;
  std::vector<Victim> victims;
  driver_->DrainChanges(scope, [&](uintptr_t lo, uintptr_t hi) {
    std::lock_guard<std::mutex> lock(mu_);
    // A call on its way to the driver: the entry it makes or puts back is
    // made after the driver's answer, so the change is noted on the call.
    MarkInflightLeftLocked(lo, hi);
    for (auto it = FirstOverlap(lo); it != entries_.end() && it->first < hi; ++it) {
      Entry& e = it->second;
      if (e.state == State::kDeferred) TakeVictim(e, EvictReason::kWatch, &victims);
      if (e.state == State::kInUse && !e.left) {
        UntrackInUse(e);
        e.left = true;
      }
    }
  });
  Evict(victims);
}

void Pool::BeforeCopy(uintptr_t lo, uintptr_t hi) {
  if (abandoned_.load(std::memory_order_relaxed)) return;
  ApplyPageChanges();
  const uintptr_t page_lo = PageFloor(lo), page_hi = PageCeil(hi);
  std::vector<Victim> victims;
  {
    std::unique_lock<std::mutex> lock(mu_);
    evicted_.wait(lock, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      for (auto it = FirstOverlap(page_lo); it != entries_.end() && it->first < page_hi; ++it) {
        if (it->second.state == State::kEvicting) return false;
      }
      return true;
    });
    TakePartlyCopied(lo, hi, &victims);
  }
  Evict(victims);
}

void Pool::TakePartlyCopied(uintptr_t lo, uintptr_t hi, std::vector<Victim>* victims) {
  const uintptr_t page_lo = PageFloor(lo), page_hi = PageCeil(hi);
  for (auto it = FirstOverlap(page_lo); it != entries_.end() && it->first < page_hi; ++it) {
    const Entry& e = it->second;
    // Inside one registration (kept or the program's): that one answers, as
    // the program expects of kept memory (pinned, or pageable if bare).
    if (e.base <= lo && RangeEnd(e.base, e.bytes) >= hi) return;
  }
  for (auto it = FirstOverlap(page_lo); it != entries_.end() && it->first < page_hi; ++it) {
    Entry& e = it->second;
    if (e.state != State::kDeferred) continue;
    // A range that copies keep releasing is not auto-pinned again (see AutoPin).
    if (e.auto_pinned) NoteQueried(e.base, e.bytes, 1);
    TakeVictim(e, EvictReason::kOverlap, victims);
  }
}

void Pool::ReleaseWatched(const std::vector<Range>& ranges) {
  for (const Range& r : ranges) driver_->Release(r.lo, r.hi);
}

std::optional<Outcome> Pool::TryHit(const RegisterRequest& req) {
  if (abandoned_.load(std::memory_order_relaxed) || Empty() || req.ptr == 0) return std::nullopt;
  // Every change the kernel has queued: another thread may be mapping new
  // memory at an address whose unmap is still on its way (its event queued,
  // not yet read), where a hit would hand back the old pages.
  ApplyPageChanges(DrainScope::kQueued);
  std::unique_lock<std::mutex> lock(mu_);
  AwaitQuiet(lock, PageFloor(req.ptr), PageCeil(RangeEnd(req.ptr, req.bytes)));
  if (HitLocked(req) == nullptr) return std::nullopt;
  return Outcome{kCudaSuccess, Action::kHit, 0};
}

Outcome Pool::Register(const RegisterRequest& req, absl::FunctionRef<int()> forward) {
  if (abandoned_.load(std::memory_order_relaxed) || req.ptr == 0 || req.bytes == 0) {
    return Outcome{forward(), Action::kForward, 0};
  }
  const uintptr_t lo = req.ptr, hi = RangeEnd(req.ptr, req.bytes);
  // The driver refuses overlaps at page granularity or finer: treat any entry
  // sharing a page with the request as overlapping.
  const uintptr_t page_lo = PageFloor(lo), page_hi = PageCeil(hi);
  ApplyPageChanges();
  std::vector<Victim> victims;
  bool forward_only = false;
  {
    std::unique_lock<std::mutex> lock(mu_);
    AwaitQuiet(lock, page_lo, page_hi);
    if (HitLocked(req) != nullptr) return Outcome{kCudaSuccess, Action::kHit, 0};
    for (auto it = FirstOverlap(page_lo); it != entries_.end() && it->first < page_hi; ++it) {
      const Entry& e = it->second;
      if (e.state == State::kInUse && e.base < hi && RangeEnd(e.base, e.bytes) > lo) {
        // The program's own view overlaps: the driver answers (712), as without lazypin.
        forward_only = true;
      }
    }
    for (auto it = FirstOverlap(page_lo); !forward_only && it != entries_.end() && it->first < page_hi;
         ++it) {
      Entry& e = it->second;
      if (e.state != State::kDeferred) continue;
      const bool exact = e.base == req.ptr && e.bytes == req.bytes && e.flags == req.flags &&
                         e.ctx == req.ctx;
      if (exact && observer_ != nullptr) {  // an exact match that HitLocked refused
        observer_->OnWarning(fmt::format(
            "LAZYPIN_CHECK_PFN: the physical pages behind {:#x} ({} bytes) changed since they "
            "were registered; a hook missed memory leaving the process. Treated as a miss.",
            e.base, e.bytes));
      }
      TakeVictim(e, exact ? EvictReason::kPfn : EvictReason::kOverlap, &victims);
    }
    counters_.misses += 1;
    // Until the driver answers, calls on this range wait, as the driver would
    // order them, so that none acts on a state the driver no longer has.
    BeginInflight(Range{lo, hi});
  }
  // forward_only: the driver normally refuses (712); if it accepts, the
  // overlapping in-use entries were stale and the new one is recorded below.
  Outcome out{kCudaSuccess, Action::kMiss, Evict(victims)};
  // Watched from before the driver registers it, so that no change of its
  // pages goes unseen; released again if the driver refuses it.
  const PassReason pass = driver_->Admit(lo, hi);
  const bool watched = pass == PassReason::kNone;
  // Not where the driver refuses without pinning (no context): it touches nothing then.
  if (!forward_only && req.ctx != nullptr) driver_->Prefault(lo, hi, req.flags);
  // What releasing it later needs is made now, on the program's thread in a
  // CUDA call: a release may run in a memory hook inside another allocator's
  // own call (jemalloc purges with madvise), where nothing may be allocated.
  if (req.ctx != nullptr) driver_->PrepareRelease(req.ctx);
  out.result = forward();
  if (!forward_only && out.result == kCudaOutOfMemory && !Empty()) {
    // Make room: release everything pooled, then try once more.
    out.evicted += ReleaseAll(EvictReason::kMakeRoom);
    out.result = forward();
  }
  std::vector<uint64_t> frames;
  if (out.result == kCudaSuccess && limits_.check_frames) {
    driver_->ReadFrames(req.ptr, req.bytes, &frames);
  }
  std::vector<Range> stale_watched;
  std::vector<uintptr_t> stale_parked;
  if (out.result == kCudaSuccess) {
    std::lock_guard<std::mutex> lock(mu_);
    // The driver just accepted this range, so any entry still overlapping it
    // is stale (its context was torn down behind our back): forget it.
    for (auto it = FirstOverlap(lo); it != entries_.end() && it->first < hi;) {
      if (it->second.state == State::kEvicting) { ++it; continue; }
      if (it->second.state == State::kDeferred) {
        if (UnparkLocked(it->second)) stale_parked.push_back(it->second.base);
        UnmarkDeferred(it->second);
      }
      if (it->second.watched) {
        stale_watched.push_back(Range{it->second.base, RangeEnd(it->second.base, it->second.bytes)});
      }
      it = Erase(it);
    }
    Entry entry{req.ptr, req.bytes, req.flags, req.ctx, req.device, State::kInUse,
                pass, watched, 0, 0, {}};
    entry.frames = std::move(frames);
    // Its pages changed while the driver registered them: the program's view
    // is gone; the driver answers for it from now on (never deferred).
    entry.left = InflightLeftLocked(Range{lo, hi});
    TrackInUse(entry);
    entries_.emplace(req.ptr, std::move(entry));
  } else if (watched) {
    stale_watched.push_back(Range{lo, hi});
  }
  EndInflight(Range{lo, hi});
  ReleaseWatched(stale_watched);
  FreeBlocks(stale_parked);
  return out;
}

bool Pool::DeferLocked(uintptr_t ptr, std::vector<Victim>* victims) {
  auto it = entries_.find(ptr);
  if (it == entries_.end() || it->second.state != State::kInUse) return false;
  Entry& e = it->second;
  if (e.left || e.pass != PassReason::kNone) return false;  // the driver answers, as without lazypin
  if (e.bytes > limits_.max_bytes || limits_.max_entries == 0) return false;
  MarkDeferred(e);
  counters_.deferred += 1;
  TakeOverBounds(victims);
  return true;
}

std::optional<Outcome> Pool::TryDefer(uintptr_t ptr) {
  if (abandoned_.load(std::memory_order_relaxed) || ptr == 0) return std::nullopt;
  // What was read is enough: an event still queued is applied before any
  // use of the entry (a hit, a register, a copy and the collector read the
  // queue), and the deferral itself hands nothing to the program.
  ApplyPageChanges(DrainScope::kReturned);
  std::vector<Victim> victims;
  {
    std::unique_lock<std::mutex> lock(mu_);
    AwaitQuiet(lock, ptr, ptr + 1);
    if (!DeferLocked(ptr, &victims)) return std::nullopt;
  }
  return Outcome{kCudaSuccess, Action::kDeferred, Evict(victims)};
}

Outcome Pool::Unregister(uintptr_t ptr, absl::FunctionRef<int()> forward, bool may_defer) {
  if (abandoned_.load(std::memory_order_relaxed) || ptr == 0) {
    return Outcome{forward(), Action::kForward, 0};
  }
  ApplyPageChanges();
  std::vector<Victim> victims;
  Entry taken{};
  bool took = false;
  // The call's bytes: the entry's it takes, else `ptr`'s.
  Range call{ptr, ptr + 1};
  {
    std::unique_lock<std::mutex> lock(mu_);
    AwaitQuiet(lock, ptr, ptr + 1);
    if (may_defer && DeferLocked(ptr, &victims)) {
      lock.unlock();
      return Outcome{kCudaSuccess, Action::kDeferred, Evict(victims)};
    }
    auto it = FirstOverlap(ptr);
    const bool contains = it != entries_.end() && it->first <= ptr;
    if (contains && it->first == ptr && it->second.state == State::kInUse) {
      // Not deferrable (too large, its memory left, or the caller said so):
      // the driver does the work now.
      taken = std::move(it->second);
      took = true;
      UntrackInUse(taken);
      entries_.erase(it);
      call = Range{taken.base, RangeEnd(taken.base, taken.bytes)};
    } else if (contains && it->second.state == State::kDeferred) {
      // The program unregisters memory it has already unregistered: make the
      // driver's view match the program's, then let the driver answer.
      TakeVictim(it->second, EvictReason::kOverlap, &victims);
    }
    BeginInflight(call);
  }
  Outcome out{kCudaSuccess, Action::kForward, Evict(victims)};
  if (took && (taken.pass != PassReason::kNone || taken.left)) {
    out.action = Action::kPassthrough;
    out.reason = taken.pass != PassReason::kNone ? taken.pass : PassReason::kLeft;
  }
  out.result = forward();
  const bool release = took && taken.watched && out.result == kCudaSuccess;
  const Range taken_range{taken.base, RangeEnd(taken.base, taken.bytes)};
  if (took && out.result != kCudaSuccess) {
    // The driver kept it: so do we, as left if its pages changed meanwhile.
    std::lock_guard<std::mutex> lock(mu_);
    taken.left = taken.left || InflightLeftLocked(call);
    TrackInUse(taken);
    entries_.emplace(taken.base, std::move(taken));
  } else if (took && out.action == Action::kPassthrough) {
    std::lock_guard<std::mutex> lock(mu_);
    counters_.passed += 1;
  }
  EndInflight(call);
  if (release) driver_->Release(taken_range.lo, taken_range.hi);
  return out;
}

bool Pool::HoldsDeferred(uintptr_t lo, uintptr_t hi) const {
  if (abandoned_.load(std::memory_order_relaxed) || hi <= lo || Empty()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  return const_cast<Pool&>(*this).HoldsDeferredLocked(lo, hi);
}

bool Pool::HoldsDeferredLocked(uintptr_t lo, uintptr_t hi) {
  for (auto it = FirstOverlap(lo); it != entries_.end() && it->first < hi; ++it) {
    if (it->second.state != State::kInUse) return true;
  }
  return false;
}

int Pool::MarkLeft(uintptr_t lo, uintptr_t hi) {
  if (abandoned_.load(std::memory_order_relaxed) || hi <= lo ||
      in_use_.load(std::memory_order_relaxed) == 0) {
    return 0;
  }
  std::lock_guard<std::mutex> lock(mu_);
  return MarkLeftLocked(lo, hi);
}

bool Pool::Leave(uintptr_t lo, uintptr_t hi, bool wait, bool* pooled) {
  *pooled = false;
  if (abandoned_.load(std::memory_order_relaxed) || hi <= lo) return true;
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  if (wait) {
    lock.lock();
  } else if (!lock.try_lock()) {
    return false;
  }
  if (in_use_.load(std::memory_order_relaxed) != 0) MarkLeftLocked(lo, hi);
  *pooled = !Empty() && HoldsDeferredLocked(lo, hi);
  return true;
}

int Pool::MarkLeftLocked(uintptr_t lo, uintptr_t hi) {
  MarkInflightLeftLocked(lo, hi);
  int marked = 0;
  for (auto it = FirstOverlap(lo); it != entries_.end() && it->first < hi; ++it) {
    Entry& e = it->second;
    if (e.state != State::kInUse || e.left) continue;
    UntrackInUse(e);
    e.left = true;
    ++marked;
  }
  return marked;
}

int Pool::Invalidate(uintptr_t lo, uintptr_t hi, EvictReason reason) {
  if (abandoned_.load(std::memory_order_relaxed) || hi <= lo) return 0;
  // Memory hooks call this, also from inside another allocator's own call
  // (jemalloc's purge madvises what it frees): nothing here allocates, so
  // the victims go in batches through a stack array.
  constexpr size_t kBatch = 16;
  int evicted = 0;
  for (;;) {
    Victim victims[kBatch];
    size_t count = 0;
    bool more = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      AwaitQuiet(lock, lo, hi);
      for (auto it = FirstOverlap(lo); it != entries_.end() && it->first < hi; ++it) {
        if (it->second.state != State::kDeferred) continue;
        if (count == kBatch) {
          more = true;
          break;
        }
        victims[count++] = TakeVictim(it->second, reason);
      }
    }
    evicted += Evict(victims, count);
    if (!more) return evicted;
  }
}

int Pool::DropWhere(absl::FunctionRef<bool(const Entry&)> matches, bool forget_in_use) {
  if (abandoned_.load(std::memory_order_relaxed)) return 0;
  std::vector<Victim> victims;
  std::vector<Range> forgotten;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = entries_.begin(); it != entries_.end();) {
      Entry& e = it->second;
      if (matches(e) && e.state == State::kInUse && forget_in_use) {
        if (e.watched) forgotten.push_back(Range{e.base, RangeEnd(e.base, e.bytes)});
        it = Erase(it);
        continue;
      }
      if (matches(e) && e.state == State::kDeferred) {
        TakeVictim(e, EvictReason::kContext, &victims);
      }
      ++it;
    }
  }
  ReleaseWatched(forgotten);
  return Evict(victims);
}

int Pool::DropContext(Context ctx, bool forget_in_use) {
  return DropWhere([ctx](const Entry& e) { return e.ctx == ctx; }, forget_in_use);
}

int Pool::DropDevice(int device, bool forget_in_use) {
  return DropWhere([device](const Entry& e) { return e.device == device; }, forget_in_use);
}

int Pool::CollectIdle(int64_t idle_ns, EvictReason reason) {
  if (abandoned_.load(std::memory_order_relaxed) || Empty()) return 0;
  const int64_t cutoff = driver_->AgeClockNs() - idle_ns;
  std::vector<Victim> victims;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // LRU order is deferral order, so the idle ones are a prefix.
    while (!lru_.empty()) {
      Entry& e = entries_.find(lru_.begin()->second)->second;
      if (e.deferred_at > cutoff) break;
      TakeVictim(e, reason, &victims);
    }
  }
  return Evict(victims);
}

int Pool::YieldWatch(uintptr_t lo, uintptr_t hi, EvictReason reason) {
  if (abandoned_.load(std::memory_order_relaxed) || !Tracking() || hi <= lo) return 0;
  std::vector<Victim> victims;
  std::vector<Range> unwatched;
  {
    std::unique_lock<std::mutex> lock(mu_);
    AwaitQuiet(lock, PageFloor(lo), PageCeil(hi));
    for (auto it = FirstOverlap(lo); it != entries_.end() && it->first < hi; ++it) {
      Entry& e = it->second;
      if (e.state == State::kDeferred) {
        TakeVictim(e, reason, &victims);
      } else if (e.state == State::kInUse && e.watched) {
        unwatched.push_back(Range{e.base, RangeEnd(e.base, e.bytes)});
        e.watched = false;
        e.pass = PassReason::kUnwatched;
      }
    }
  }
  ReleaseWatched(unwatched);
  return Evict(victims) + static_cast<int>(unwatched.size());
}

int Pool::ReleaseAll(EvictReason reason) {
  if (abandoned_.load(std::memory_order_relaxed)) return 0;
  std::vector<Victim> victims;
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (!lru_.empty()) {
      TakeVictim(entries_.find(lru_.begin()->second)->second, reason, &victims);
    }
  }
  return Evict(victims);
}

void Pool::AbandonAfterFork(bool unregister_deferred) {
  abandoned_.store(true, std::memory_order_relaxed);
  if (unregister_deferred && mu_.try_lock()) {
    for (const auto& [base, e] : entries_) {
      if (e.state != State::kDeferred) continue;
      ReleaseWait no_wait;
      no_wait.after_wait = true;
      driver_->Unregister(base, e.ctx, &no_wait);
    }
    mu_.unlock();
  }
  holding_.store(0, std::memory_order_relaxed);
  in_use_.store(0, std::memory_order_relaxed);
  zero_writing_.store(0, std::memory_order_relaxed);  // the zeroing thread is the parent's
  // The child never hands out a parked block (the parent's fork-prepare
  // release freed them; any left are the parent's, leaked here).
  if (reuse_.gauge != nullptr) reuse_.gauge->store(0, std::memory_order_relaxed);
}

PoolCounters Pool::Counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

}  // namespace lazypin
