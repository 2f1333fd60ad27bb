// granule_filter: a counting filter over 2 MiB granules of the address space,
// so that a memory hook (free, munmap, ...) can tell in a few relaxed loads that
// no pooled registration can overlap the range it is about to release. Like a
// Bloom filter with deletions: false positives fall through to the pool's exact
// lookup, false negatives cannot happen. Writers hold the pool's lock.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace lazypin {

class GranuleFilter {
 public:
  static constexpr int kGranuleShift = 21;  // 2 MiB
  static constexpr int kSlotBits = 16;
  static constexpr size_t kSlots = size_t{1} << kSlotBits;
  // A range spanning more granules than this is not scanned: "maybe".
  static constexpr uintptr_t kMaxScan = 1024;

  void Add(uintptr_t lo, uintptr_t hi) { Update(lo, hi, 1); }
  void Remove(uintptr_t lo, uintptr_t hi) { Update(lo, hi, static_cast<uint32_t>(-1)); }

  // False only if no range added (and not removed) overlaps [lo, hi).
  bool MaybeOverlaps(uintptr_t lo, uintptr_t hi) const {
    if (hi <= lo) return false;
    const uintptr_t first = lo >> kGranuleShift, last = (hi - 1) >> kGranuleShift;
    if (last - first >= kMaxScan) return true;
    for (uintptr_t g = first; g <= last; ++g) {
      if (slots_[Slot(g)].load(std::memory_order_relaxed) != 0) return true;
    }
    return false;
  }

 private:
  static size_t Slot(uintptr_t granule) {
    return static_cast<size_t>((granule * 0x9E3779B97F4A7C15ull) >> (64 - kSlotBits));
  }
  void Update(uintptr_t lo, uintptr_t hi, uint32_t delta) {
    if (hi <= lo) return;
    const uintptr_t first = lo >> kGranuleShift, last = (hi - 1) >> kGranuleShift;
    // A huge range may wrap the table several times; every slot it touches counts.
    for (uintptr_t g = first; g <= last; ++g) {
      slots_[Slot(g)].fetch_add(delta, std::memory_order_relaxed);
    }
  }

  std::atomic<uint32_t> slots_[kSlots] = {};
};

}  // namespace lazypin
