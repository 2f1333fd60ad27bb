// granule_filter: a counting filter over granules of the address space, so
// that a memory hook (free, munmap, ...) can tell in a few relaxed loads that
// no pooled registration can overlap the range it is about to release. Like a
// Bloom filter with deletions: false positives fall through to the pool's exact
// lookup, false negatives cannot happen. Writers hold the pool's lock.
// A range is counted in the table of its size class: 2 MiB granules below
// 16 MiB, 16 MiB granules below 256 MiB, 1 GiB granules from there on, so
// that adding or removing a range touches at most 17 slots below 16 GiB
// (a hit or a deferral of a 256 MiB buffer updates 1-2 slots, not 128).
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
  static constexpr int kClasses = 3;
  // Granule shift of each class, and the smallest range it takes.
  static constexpr int kShift[kClasses] = {21, 24, 30};  // 2 MiB, 16 MiB, 1 GiB
  static constexpr uintptr_t kFrom[kClasses] = {0, uintptr_t{1} << 24, uintptr_t{1} << 28};
  static constexpr int kSlotBits = 16;
  static constexpr size_t kSlots = size_t{1} << kSlotBits;
  // A range spanning more granules than this is not scanned: "maybe".
  static constexpr uintptr_t kMaxScan = 1024;

  // Faults the tables' pages in (contents unchanged; safe while other
  // threads use the filter), so that no Add or Remove takes a page fault.
  // For a thread of lazypin's, off the program's path. 3 x 256 KiB resident.
  void Prefault() {
    for (auto& table : tables_) {
      if (table == nullptr) continue;
      for (size_t i = 0; i < kSlots; i += 4096 / sizeof(table[0])) {
        table[i].fetch_add(0, std::memory_order_relaxed);
      }
    }
  }

  void Add(uintptr_t lo, uintptr_t hi) { Update(lo, hi, 1); }
  void Remove(uintptr_t lo, uintptr_t hi) { Update(lo, hi, static_cast<uint32_t>(-1)); }

  // False only if no range added (and not removed) overlaps [lo, hi).
  bool MaybeOverlaps(uintptr_t lo, uintptr_t hi) const {
    if (hi <= lo) return false;
    if (Scan(0, lo, hi)) return true;
    for (int c = 1; c < kClasses; ++c) {
      if (used_[c].load(std::memory_order_relaxed) != 0 && Scan(c, lo, hi)) return true;
    }
    return false;
  }

 private:
  static int ClassOf(uintptr_t bytes) {
    int c = 0;
    while (c + 1 < kClasses && bytes >= kFrom[c + 1]) ++c;
    return c;
  }
  static size_t Slot(uintptr_t granule) {
    return static_cast<size_t>((granule * 0x9E3779B97F4A7C15ull) >> (64 - kSlotBits));
  }
  bool Scan(int c, uintptr_t lo, uintptr_t hi) const {
    const std::atomic<uint32_t>* table = tables_[c].get();
    const uintptr_t first = lo >> kShift[c], last = (hi - 1) >> kShift[c];
    if (table == nullptr || last - first >= kMaxScan) return true;
    for (uintptr_t g = first; g <= last; ++g) {
      if (table[Slot(g)].load(std::memory_order_relaxed) != 0) return true;
    }
    return false;
  }
  void Update(uintptr_t lo, uintptr_t hi, uint32_t delta) {
    if (hi <= lo) return;
    const int c = ClassOf(hi - lo);
    std::atomic<uint32_t>* table = tables_[c].get();
    if (table == nullptr) return;
    if (c != 0) used_[c].fetch_add(delta, std::memory_order_relaxed);
    // A huge range may wrap the table several times; every slot it touches counts.
    for (uintptr_t g = lo >> kShift[c]; g <= (hi - 1) >> kShift[c]; ++g) {
      table[Slot(g)].fetch_add(delta, std::memory_order_relaxed);
    }
  }

  // Each table is its own anonymous mapping (256 KiB of zeros that nothing
  // writes up front), so a new filter costs no page faults where it is made
  // (set-up; Prefault faults it in later, off every path that waits on it).
  // Null only if the mapping failed: then every range "maybe" overlaps.
  static constexpr size_t kTableBytes = kSlots * sizeof(std::atomic<uint32_t>);
  struct Free {
    void operator()(std::atomic<uint32_t>* table) const { munmap(table, kTableBytes); }
  };
  static std::atomic<uint32_t>* Zeroed() {
    void* table = mmap(nullptr, kTableBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return table == MAP_FAILED ? nullptr : static_cast<std::atomic<uint32_t>*>(table);
  }
  std::unique_ptr<std::atomic<uint32_t>[], Free> tables_[kClasses] = {
      std::unique_ptr<std::atomic<uint32_t>[], Free>{Zeroed()},
      std::unique_ptr<std::atomic<uint32_t>[], Free>{Zeroed()},
      std::unique_ptr<std::atomic<uint32_t>[], Free>{Zeroed()}};
  std::atomic<uint32_t> used_[kClasses] = {};  // ranges counted in each class (0: unused)
};

}  // namespace lazypin
