// pool_autopin: the pool's auto-pin admission (LAZYPIN_AUTOPIN; pool.h,
// Pool::AutoPin): which pageable ranges of copies lazypin registers for
// itself, and the ranges that queries and copies keep releasing, which it
// does not pin again.
#include "pool.h"

#include <iterator>
#include <utility>

#include "pages.h"

namespace lazypin {

Pool::Queried* Pool::FindQueried(uintptr_t base, size_t bytes) {
  for (Queried& q : queried_) {
    if (q.count > 0 && q.base == base && q.bytes == bytes) return &q;
  }
  return nullptr;
}

void Pool::NoteQueried(uintptr_t base, size_t bytes, int count) {
  Queried* q = FindQueried(base, bytes);
  if (q == nullptr) {
    q = &queried_[queried_next_];
    queried_next_ = (queried_next_ + 1) % static_cast<int>(std::size(queried_));
    *q = Queried{base, bytes, 0};
  }
  q->count += count;
}

AutoPinOutcome Pool::AutoPin(const RegisterRequest& req, uint64_t max_auto_bytes,
                             absl::FunctionRef<bool()> eligible,
                             absl::FunctionRef<int()> register_fn) {
  AutoPinOutcome out;
  if (abandoned_.load(std::memory_order_relaxed) || req.ptr == 0 || req.bytes == 0) return out;
  const uintptr_t lo = req.ptr, hi = RangeEnd(req.ptr, req.bytes);
  const uintptr_t page_lo = PageFloor(lo), page_hi = PageCeil(hi);
  ApplyPageChanges();
  {
    // As BeforeCopy did for this copy: another thread may have pinned a range
    // this copy covers in part since.
    std::vector<Victim> partly;
    {
      std::unique_lock<std::mutex> lock(mu_);
      AwaitQuiet(lock, page_lo, page_hi);
      TakePartlyCopied(lo, hi, &partly);
    }
    Evict(partly);
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    AwaitQuiet(lock, page_lo, page_hi);
    bool shared_page = false;
    for (auto it = FirstOverlap(page_lo); it != entries_.end() && it->first < page_hi; ++it) {
      Entry& e = it->second;
      if (e.state == State::kDeferred && e.ctx == req.ctx && e.base <= lo &&
          RangeEnd(e.base, e.bytes) >= hi) {
        // Still pinned: this copy runs at the pinned rate. In use, so not idle.
        lru_.erase(e.lru_key);
        e.lru_key = next_lru_key_++;
        e.deferred_at = driver_->AgeClockNs();
        lru_.emplace(e.lru_key, e.base);
        counters_.autopin_copies += 1;
        counters_.autopin_copy_bytes += req.bytes;
        out.result = AutoPinResult::kCovered;
        return out;
      }
      shared_page = true;
    }
    if (shared_page) return out;  // the program's, or partly pooled: leave it alone
    if (const Queried* q = FindQueried(req.ptr, req.bytes);
        q != nullptr && q->count >= kAutoPinQueryLimit) {
      counters_.autopin_queried += 1;
      return out;
    }
    if (req.bytes > limits_.max_bytes || counters_.pooled_bytes + req.bytes > limits_.max_bytes ||
        counters_.pooled_entries + 1 > limits_.max_entries ||
        counters_.autopinned_bytes + req.bytes > max_auto_bytes) {
      counters_.autopin_full += 1;  // never evicts to make room: the copy stays pageable
      return out;
    }
    // Until the driver answers, calls on this range wait (as in Register).
    BeginInflight(Range{lo, hi});
  }
  const Range call{lo, hi};
  if (!eligible() || driver_->Admit(lo, hi) != PassReason::kNone) {
    EndInflight(call);
    return out;
  }
  out.attempted = true;
  const int64_t t0 = driver_->NowNs();
  // Large ranges are faulted in by several threads first, as for a program's
  // first register (LAZYPIN_PREFAULT); part of the register's cost.
  driver_->Prefault(lo, hi, 0);
  out.driver_result = register_fn();
  out.register_ns = driver_->NowNs() - t0;
  if (out.driver_result != kCudaSuccess) {
    driver_->Release(lo, hi);
    {
      // Refused (read-only memory, registered behind the pool's back, out of
      // pinnable memory): not asked again for each copy of it.
      std::lock_guard<std::mutex> lock(mu_);
      NoteQueried(req.ptr, req.bytes, kAutoPinQueryLimit);
    }
    EndInflight(call);
    return out;
  }
  std::vector<uint64_t> frames;
  if (limits_.check_frames) driver_->ReadFrames(req.ptr, req.bytes, &frames);
  std::vector<Victim> victims;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Built as a left in-use entry, so that MarkDeferred finds nothing to untrack.
    Entry entry{req.ptr, req.bytes, 0, req.ctx, req.device, State::kInUse,
                PassReason::kNone, /*watched=*/true, 0, 0, std::move(frames)};
    entry.left = true;
    Entry& e = entries_.emplace(req.ptr, std::move(entry)).first->second;
    MarkDeferred(e);
    e.left = false;
    e.auto_pinned = true;
    counters_.autopinned_bytes += e.bytes;
    counters_.autopins += 1;
    counters_.autopin_bytes += e.bytes;
    counters_.autopin_register_ns += out.register_ns;
    if (InflightLeftLocked(call)) {
      // Its pages changed while the driver registered them: released at once.
      TakeVictim(e, EvictReason::kWatch, &victims);
    }
    // Checked before the register; another thread may have filled the pool
    // since: the bounds hold anyway (least recently used first, as a deferral does).
    TakeOverBounds(&victims);
  }
  out.result = AutoPinResult::kPinned;
  EndInflight(call);
  Evict(victims);
  return out;
}

}  // namespace lazypin
