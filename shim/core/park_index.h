// park_index: the blocks lazypin keeps parked (freed by the program while a
// deferred registration holds them), indexed by malloc_usable_size, so that
// an allocation finds one of a size its own fresh block could have and of
// the alignment it needs. Not thread-safe: the pool holds its lock around
// every call. Allocates nothing (fixed arrays, chained buckets): Add runs in
// the free hook, possibly in a signal handler that interrupted the allocator
// itself, where a malloc would wait for the allocator's lock forever.
// Each block also says whether it is to be zeroed ahead of its reuse (one
// that is served zeroed anyway: an mmapped chunk) and whether it has been.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lazypin {

class ParkIndex {
 public:
  static constexpr int kCapacity = 4096;  // blocks parked at once, at most
  static constexpr int kBuckets = 256;

  ParkIndex() {
    for (int i = 0; i < kBuckets; ++i) head_[i] = -1;
    for (int i = 0; i < kCapacity; ++i) next_[i] = i + 1 < kCapacity ? i + 1 : -1;
    free_ = 0;
  }
  ParkIndex(const ParkIndex&) = delete;
  ParkIndex& operator=(const ParkIndex&) = delete;

  // False if full (then the block is not parked).
  bool Add(uintptr_t block, size_t usable, bool zero_ahead = false) {
    if (free_ < 0) return false;
    const int slot = free_;
    free_ = next_[slot];
    block_[slot] = block;
    usable_[slot] = usable;
    marks_[slot] = zero_ahead ? kZeroAhead : 0;
    to_zero_ += zero_ahead;
    int& head = head_[Bucket(usable)];
    next_[slot] = head;
    head = slot;
    ++size_;
    return true;
  }
  // False if it was not parked.
  bool Remove(uintptr_t block, size_t usable) {
    for (int* link = &head_[Bucket(usable)]; *link >= 0; link = &next_[*link]) {
      const int slot = *link;
      if (block_[slot] == block && usable_[slot] == usable) {
        Unlink(link);
        return true;
      }
    }
    return false;
  }
  // Takes a parked block whose usable size is one of `usable[0..count)` (in
  // that order of preference) and whose address is a multiple of `align` (a
  // power of two; 0 or 1: any); 0 if none. `*zeroed` (may be null): whether
  // MarkZeroed was said of it.
  uintptr_t Take(const size_t* usable, int count, size_t align, bool* zeroed = nullptr) {
    const uintptr_t mask = align > 1 ? align - 1 : 0;
    for (int i = 0; i < count; ++i) {
      for (int* link = &head_[Bucket(usable[i])]; *link >= 0; link = &next_[*link]) {
        const int slot = *link;
        if (usable_[slot] != usable[i] || (block_[slot] & mask) != 0) continue;
        const uintptr_t block = block_[slot];
        if (zeroed != nullptr) *zeroed = (marks_[slot] & kZeroed) != 0;
        Unlink(link);
        return block;
      }
    }
    return 0;
  }
  // A block to be zeroed ahead and not zeroed yet (its usable size in
  // `*usable`), 0 if none.
  uintptr_t NextToZero(size_t* usable) const {
    if (to_zero_ == 0) return 0;
    for (int bucket = 0; bucket < kBuckets; ++bucket) {
      for (int slot = head_[bucket]; slot >= 0; slot = next_[slot]) {
        if (marks_[slot] == kZeroAhead) {
          *usable = usable_[slot];
          return block_[slot];
        }
      }
    }
    return 0;
  }
  // The block parked at `block` with `usable` now reads as zeros to its end.
  void MarkZeroed(uintptr_t block, size_t usable) {
    for (int slot = head_[Bucket(usable)]; slot >= 0; slot = next_[slot]) {
      if (block_[slot] == block && usable_[slot] == usable && marks_[slot] == kZeroAhead) {
        marks_[slot] |= kZeroed;
        --to_zero_;
      }
    }
  }
  int size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  static constexpr uint8_t kZeroAhead = 1, kZeroed = 2;
  static int Bucket(size_t usable) { return static_cast<int>((usable >> 4) % kBuckets); }
  void Unlink(int* link) {
    const int slot = *link;
    to_zero_ -= marks_[slot] == kZeroAhead;
    *link = next_[slot];
    next_[slot] = free_;
    free_ = slot;
    --size_;
  }

  uintptr_t block_[kCapacity];
  size_t usable_[kCapacity];
  uint8_t marks_[kCapacity];  // kZeroAhead, kZeroed
  int next_[kCapacity];  // bucket chain while parked, free list otherwise
  int head_[kBuckets];
  int free_;
  int size_ = 0;
  int to_zero_ = 0;  // blocks marked kZeroAhead and not kZeroed
};

}  // namespace lazypin
