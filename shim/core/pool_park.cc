// pool_park: the pool's parked blocks (LAZYPIN_REUSE_FREED; pool.h,
// ReuseHooks): freed blocks kept registered, handed to an allocation of
// their kind.
#include "pool.h"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <iterator>

#include "memory_budget.h"
#include "pages.h"
#include "zero_fill.h"

namespace lazypin {

bool Pool::UnparkLocked(Entry& e) {
  if (e.parked == 0) return false;
  park_.Remove(e.base, e.parked);
  ForgetParked(e);
  return true;
}

void Pool::ForgetParked(Entry& e) {
  if (e.base == zero_block_) zero_cancel_.store(true, std::memory_order_seq_cst);
  park_filter_[ParkSlot(e.parked)].fetch_sub(1, std::memory_order_relaxed);
  counters_.parked_bytes -= e.parked;
  e.parked = 0;
  counters_.parked_now -= 1;
}

void Pool::AwaitZeroWrite(uintptr_t block) const {
  // A step's write is about 15 us; a caller that outranks the collector on
  // its CPU (a real-time thread) is not helped by yielding: it sleeps.
  for (int spins = 0; zero_writing_.load(std::memory_order_seq_cst) == block; ++spins) {
    if (spins < 64) {
      sched_yield();
    } else {
      struct timespec pause = {0, 50000};
      nanosleep(&pause, nullptr);
    }
  }
}

void Pool::FreeParked(uintptr_t block) {
  AwaitZeroWrite(block);
  reuse_.free_block(reinterpret_cast<void*>(block));
  if (reuse_.gauge != nullptr) reuse_.gauge->fetch_sub(1, std::memory_order_relaxed);
}

void Pool::FreeBlocks(const std::vector<uintptr_t>& blocks) {
  for (uintptr_t block : blocks) FreeParked(block);
}

void Pool::EnableReuse(ReuseHooks hooks) { reuse_ = hooks; }

bool Pool::Park(uintptr_t block, size_t usable, bool zero_ahead) {
  if (!ReuseEnabled() || abandoned_.load(std::memory_order_relaxed) || Empty() || usable == 0) {
    return false;
  }
  if (reuse_.budget != nullptr && !reuse_.budget->MayKeep()) return false;
  const uintptr_t hi = RangeEnd(block, usable);
  std::lock_guard<std::mutex> lock(mu_);
  if (!RangeQuiet(PageFloor(block), PageCeil(hi))) return false;  // never wait here (a handler)
  auto it = FirstOverlap(block);
  if (it == entries_.end() || it->first != block) return false;
  Entry& e = it->second;
  if (e.state != State::kDeferred || e.parked != 0 || e.bytes > usable) return false;
  if (counters_.parked_bytes + usable > reuse_.max_bytes) return false;
  if (auto next = std::next(it); next != entries_.end() && next->first < hi) return false;
  if (!park_.Add(block, usable, zero_ahead)) return false;  // full: handled as before
  e.parked = usable;
  park_filter_[ParkSlot(usable)].fetch_add(1, std::memory_order_relaxed);
  counters_.parked += 1;
  counters_.parked_now += 1;
  counters_.parked_bytes += usable;
  if (reuse_.gauge != nullptr) reuse_.gauge->fetch_add(1, std::memory_order_relaxed);
  return true;
}

uintptr_t Pool::Unpark(const FreshSizes& sizes, size_t align, bool* zeroed) {
  if (abandoned_.load(std::memory_order_relaxed) || !MaybeParked(sizes)) return 0;
  // An allocation never blocks on lazypin's lock: it tries a few times,
  // yielding to the holder (who never calls the driver with it held), then
  // allocates fresh memory (one hit less). So no lock the caller holds
  // (stdio's, the program's own) is ever ordered against the pool's.
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  for (int tries = 0; !lock.owns_lock() && tries < kUnparkTries; ++tries) {
    sched_yield();
    lock.try_lock();
  }
  if (!lock.owns_lock()) return 0;
  const uintptr_t block = park_.Take(sizes.usable, sizes.count, align, zeroed);
  if (block == 0) return 0;
  ForgetParked(entries_.find(block)->second);  // a parked block's entry is deferred, based at it
  if (reuse_.gauge != nullptr) reuse_.gauge->fetch_sub(1, std::memory_order_relaxed);
  counters_.served += 1;
  if (zeroed != nullptr && *zeroed) counters_.served_zeroed += 1;
  lock.unlock();
  AwaitZeroWrite(block);  // in the middle of its zeroing: one step's write at most
  return block;
}

size_t Pool::ZeroParkedStep(size_t max_bytes) {
  // A block that left the park ends its round without a write; the next one
  // parked is stepped at once.
  for (int round = 0; round < 2; ++round) {
    bool cancelled = false;
    const size_t wrote = ZeroParkedStepOnce(max_bytes, &cancelled);
    if (!cancelled) return wrote;
  }
  return 0;
}

size_t Pool::ZeroParkedStepOnce(size_t max_bytes, bool* was_cancelled) {
  if (abandoned_.load(std::memory_order_relaxed) || max_bytes == 0) return 0;
  uintptr_t block = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (zero_block_ == 0) {
      if (counters_.parked_now == 0) return 0;
      size_t usable = 0;
      zero_block_ = park_.NextToZero(&usable);
      if (zero_block_ == 0) return 0;
      zero_usable_ = usable;
      zero_done_ = 0;
      zero_cancel_.store(false, std::memory_order_seq_cst);
    }
    block = zero_block_;
  }
  const size_t n = std::min(max_bytes, zero_usable_ - zero_done_);
  zero_writing_.store(block, std::memory_order_seq_cst);
  const bool cancelled = zero_cancel_.load(std::memory_order_seq_cst);
  if (!cancelled) {
    ZeroNonTemporal(reinterpret_cast<void*>(block + zero_done_), n);
    zero_done_ += n;
  }
  zero_writing_.store(0, std::memory_order_release);
  if (cancelled || zero_done_ == zero_usable_) {
    std::lock_guard<std::mutex> lock(mu_);
    // Still parked (no cancel under the lock): a block parked again at that
    // address after a release was cancelled first, so this is the one zeroed.
    if (!zero_cancel_.load(std::memory_order_relaxed)) park_.MarkZeroed(block, zero_usable_);
    zero_block_ = 0;
  }
  *was_cancelled = cancelled;
  return cancelled ? 0 : n;
}

int Pool::ReleaseParked(EvictReason reason, uintptr_t lo, uintptr_t hi) {
  if (abandoned_.load(std::memory_order_relaxed)) return 0;
  // One at a time, allocating nothing: an allocation just failed.
  int released = 0;
  for (;;) {
    Victim victim[1];
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = FirstOverlap(lo);
      while (it != entries_.end() && it->first < hi && it->second.parked == 0) ++it;
      if (it == entries_.end() || it->first >= hi) break;
      victim[0] = TakeVictim(it->second, reason);
    }
    released += Evict(victim, 1);
  }
  return released;
}

bool Pool::ReleaseOldestParked(EvictReason reason) {
  if (abandoned_.load(std::memory_order_relaxed)) return false;
  Victim victim[1];
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (counters_.parked_now == 0) return false;
    auto it = lru_.begin();
    while (it != lru_.end() && entries_.find(it->second)->second.parked == 0) ++it;
    if (it == lru_.end()) return false;
    victim[0] = TakeVictim(entries_.find(it->second)->second, reason);
  }
  return Evict(victim, 1) > 0;
}

void Pool::ForEachParked(absl::FunctionRef<void(uintptr_t, size_t)> each) const {
  if (abandoned_.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (counters_.parked_now == 0) return;
  for (const auto& [base, e] : entries_) {
    if (e.state == State::kDeferred && e.parked != 0) each(base, e.parked);
  }
}

bool Pool::HoldsParked(uintptr_t block) const {
  if (abandoned_.load(std::memory_order_relaxed) || Empty()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(block);
  return it != entries_.end() && it->second.parked != 0;
}

}  // namespace lazypin
