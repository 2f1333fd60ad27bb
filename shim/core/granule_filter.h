// granule_filter: a counting filter over 2 MiB granules of the address space,
// so that a memory hook (free, munmap, ...) can tell in a few relaxed loads that
// no pooled registration can overlap the range it is about to release. Like a
// Bloom filter with deletions: false positives fall through to the pool's exact
// lookup, false negatives cannot happen. Writers hold the pool's lock.
// Ranges of 256 MiB and more are counted in a second, coarse table of 1 GiB
// granules, so that pooling a huge buffer costs a few updates, not thousands.
#pragma once

#include <sys/mman.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>

#include "pages.h"

namespace lazypin {

class GranuleFilter {
 public:
  static constexpr int kGranuleShift = 21;        // 2 MiB
  static constexpr int kCoarseShift = 30;         // 1 GiB
  static constexpr uintptr_t kCoarseFrom = uintptr_t{1} << 28;  // ranges >= 256 MiB
  static constexpr int kSlotBits = 16;
  static constexpr size_t kSlots = size_t{1} << kSlotBits;
  // A range spanning more granules than this is not scanned: "maybe".
  static constexpr uintptr_t kMaxScan = 1024;

  // Faults both tables' pages in (contents unchanged; safe while other
  // threads use the filter), so that no Add or Remove takes a page fault.
  // For a thread of lazypin's, off the program's path. 2 x 256 KiB resident.
  void Prefault() {
    for (std::atomic<uint32_t>* table : {fine_.get(), coarse_.get()}) {
      if (table == nullptr) continue;
      if (PopulateWrite(table, kTableBytes)) continue;
      for (size_t i = 0; i < kSlots; i += 4096 / sizeof(*table)) {
        table[i].fetch_add(0, std::memory_order_relaxed);
      }
    }
  }

  void Add(uintptr_t lo, uintptr_t hi) { Update(lo, hi, 1); }
  void Remove(uintptr_t lo, uintptr_t hi) { Update(lo, hi, static_cast<uint32_t>(-1)); }

  // False only if no range added (and not removed) overlaps [lo, hi).
  bool MaybeOverlaps(uintptr_t lo, uintptr_t hi) const {
    if (hi <= lo) return false;
    return Scan(fine_.get(), kGranuleShift, lo, hi) ||
           (coarse_used_.load(std::memory_order_relaxed) != 0 &&
            Scan(coarse_.get(), kCoarseShift, lo, hi));
  }

 private:
  static size_t Slot(uintptr_t granule) {
    return static_cast<size_t>((granule * 0x9E3779B97F4A7C15ull) >> (64 - kSlotBits));
  }
  static bool Scan(const std::atomic<uint32_t>* table, int shift, uintptr_t lo, uintptr_t hi) {
    const uintptr_t first = lo >> shift, last = (hi - 1) >> shift;
    if (table == nullptr || last - first >= kMaxScan) return true;
    for (uintptr_t g = first; g <= last; ++g) {
      if (table[Slot(g)].load(std::memory_order_relaxed) != 0) return true;
    }
    return false;
  }
  void Update(uintptr_t lo, uintptr_t hi, uint32_t delta) {
    if (hi <= lo) return;
    const bool coarse = hi - lo >= kCoarseFrom;
    const int shift = coarse ? kCoarseShift : kGranuleShift;
    std::atomic<uint32_t>* table = coarse ? coarse_.get() : fine_.get();
    if (table == nullptr) return;
    if (coarse) coarse_used_.fetch_add(delta, std::memory_order_relaxed);
    // A huge range may wrap the table several times; every slot it touches counts.
    for (uintptr_t g = lo >> shift; g <= (hi - 1) >> shift; ++g) {
      table[Slot(g)].fetch_add(delta, std::memory_order_relaxed);
    }
  }

  // Each table is its own anonymous mapping (256 KiB of zeros that nothing
  // writes up front), so a new filter costs no page faults where it is made
  // (set-up; Prefault faults it in later, off every path that waits on it).
  // Null only if the mapping failed: then every
  // range "maybe" overlaps.
  static constexpr size_t kTableBytes = kSlots * sizeof(std::atomic<uint32_t>);
  struct Free {
    void operator()(std::atomic<uint32_t>* table) const { munmap(table, kTableBytes); }
  };
  static std::atomic<uint32_t>* Zeroed() {
    void* table = mmap(nullptr, kTableBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return table == MAP_FAILED ? nullptr : static_cast<std::atomic<uint32_t>*>(table);
  }
  std::unique_ptr<std::atomic<uint32_t>[], Free> fine_{Zeroed()};
  std::unique_ptr<std::atomic<uint32_t>[], Free> coarse_{Zeroed()};
  std::atomic<uint32_t> coarse_used_{0};
};

}  // namespace lazypin
