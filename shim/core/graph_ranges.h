// graph_ranges: the host memory the program's CUDA graphs copy from or to.
// A graph replays its memcpy nodes at every launch, through whatever
// registration the driver holds then. Where the pool holds a deferred one (the
// program unregistered that memory, or auto-pin pinned it), the node would copy
// pinned, asynchronously, and from frames that may have changed, where without
// lazypin the driver finds pageable memory. So the hooks note each memcpy
// node's host ranges here, by the graph that holds it (a captured copy by the
// capture's stream until the capture ends) and by each executable graph made
// from it, and before a graph is instantiated or launched the deferred entries
// there are released (docs/design.md, "Graphs").
//
// Contracts: thread-safe; never calls the driver or the pool. Ranges only
// grow an owner's set (a node whose parameters change adds its new ranges;
// the old ones stay: releasing more than needed costs time, never bytes).
// Each owner keeps at most kMaxPerOwner ranges, past which they merge into
// one covering range. A node whose graph is unknown (parameters set on a node
// handle) goes to a stray list that every launch also covers (the last
// kMaxStray). A program that never makes a graph pays one relaxed load.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/functional/function_ref.h"

namespace lazypin {

class GraphRanges {
 public:
  struct Range {
    uintptr_t lo, hi;
  };
  static constexpr size_t kMaxPerOwner = 1024;
  static constexpr size_t kMaxStray = 64;

  // A copy recorded by the capture of the stream `capture_key` names [lo, hi).
  void AddToCapture(uint64_t capture_key, Range range);
  // That capture ended: its ranges belong to `graph` (null: it made none).
  void EndCapture(uint64_t capture_key, const void* graph);
  // A memcpy node of `owner` (a graph or an executable graph) names `range`.
  void Add(const void* owner, Range range);
  // A memcpy node of an unknown graph names `range`.
  void AddStray(Range range);
  // `to` is made from `from` (instantiated, cloned, updated, or `from` is a
  // child graph of it): it gets `from`'s ranges too.
  void CopyTo(const void* from, const void* to);
  // `owner` is destroyed.
  void Forget(const void* owner);
  // Calls visit(range) for each range of `owner` and each stray range,
  // without the lock held.
  void ForEach(const void* owner, absl::FunctionRef<void(Range)> visit) const;
  // Cheap and lock-free: false means ForEach visits nothing for any owner.
  bool Any() const { return any_.load(std::memory_order_relaxed); }

 private:
  static uint64_t Key(const void* owner) { return reinterpret_cast<uintptr_t>(owner); }
  // Owners' keys: graph and exec handles; captures' keys (stream handles or
  // a thread id | 1) in their own map.
  void AddLocked(std::vector<Range>& set, Range range) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable std::mutex mu_;
  absl::btree_map<uint64_t, std::vector<Range>> owners_ ABSL_GUARDED_BY(mu_);
  absl::btree_map<uint64_t, std::vector<Range>> captures_ ABSL_GUARDED_BY(mu_);
  std::vector<Range> stray_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> any_{false};
};

// The process's registry.
GraphRanges& Graphs();

}  // namespace lazypin
