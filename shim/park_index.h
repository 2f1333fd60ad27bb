// park_index: the blocks lazypin keeps parked (freed by the program while a
// deferred registration holds them), indexed by malloc_usable_size and then
// address, so that an allocation finds one of a size its own fresh block
// could have and of the alignment it needs. Not thread-safe: the pool holds
// its lock around every call. Allocates (btree nodes): callers are inside
// lazypin's code, where the allocation hooks pass straight through.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "absl/container/btree_set.h"

namespace lazypin {

class ParkIndex {
 public:
  void Add(uintptr_t block, size_t usable) { blocks_.emplace(usable, block); }
  // False if it was not parked.
  bool Remove(uintptr_t block, size_t usable) { return blocks_.erase({usable, block}) != 0; }
  // Takes the lowest-addressed parked block whose usable size is one of
  // `usable[0..count)` and whose address is a multiple of `align` (a power
  // of two; 0 or 1: any); 0 if none.
  uintptr_t Take(const size_t* usable, int count, size_t align) {
    const uintptr_t mask = align > 1 ? align - 1 : 0;
    for (int i = 0; i < count; ++i) {
      for (auto it = blocks_.lower_bound({usable[i], 0});
           it != blocks_.end() && it->first == usable[i]; ++it) {
        if ((it->second & mask) != 0) continue;
        const uintptr_t block = it->second;
        blocks_.erase(it);
        return block;
      }
    }
    return 0;
  }
  size_t size() const { return blocks_.size(); }
  bool empty() const { return blocks_.empty(); }

 private:
  absl::btree_set<std::pair<size_t, uintptr_t>> blocks_;  // (usable, block)
};

}  // namespace lazypin
