// graph_ranges: the host memory the program's graphs copy (see graph_ranges.h).
#include "graph_ranges.h"

#include <algorithm>

namespace lazypin {

void GraphRanges::AddLocked(std::vector<Range>& set, Range range) {
  if (range.hi <= range.lo) return;
  any_.store(true, std::memory_order_relaxed);
  for (const Range& r : set) {
    if (r.lo <= range.lo && range.hi <= r.hi) return;  // already covered
  }
  if (set.size() >= kMaxPerOwner) {
    // Bounded: one range covering them all (releasing more costs time only).
    Range hull = range;
    for (const Range& r : set) {
      hull.lo = std::min(hull.lo, r.lo);
      hull.hi = std::max(hull.hi, r.hi);
    }
    set.assign(1, hull);
    return;
  }
  set.push_back(range);
}

void GraphRanges::AddToCapture(uint64_t capture_key, Range range) {
  std::lock_guard<std::mutex> lock(mu_);
  AddLocked(captures_[capture_key], range);
}

void GraphRanges::EndCapture(uint64_t capture_key, const void* graph) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = captures_.find(capture_key);
  if (it == captures_.end()) return;
  if (graph != nullptr) {
    std::vector<Range>& set = owners_[Key(graph)];
    for (const Range& r : it->second) AddLocked(set, r);
  }
  captures_.erase(it);
}

void GraphRanges::Add(const void* owner, Range range) {
  std::lock_guard<std::mutex> lock(mu_);
  AddLocked(owners_[Key(owner)], range);
}

void GraphRanges::AddStray(Range range) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stray_.size() >= kMaxStray) stray_.erase(stray_.begin());
  AddLocked(stray_, range);
}

void GraphRanges::CopyTo(const void* from, const void* to) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = owners_.find(Key(from));
  if (it == owners_.end()) return;
  const std::vector<Range> ranges = it->second;  // `to` may be a new key: no reference across
  std::vector<Range>& set = owners_[Key(to)];
  for (const Range& r : ranges) AddLocked(set, r);
}

void GraphRanges::Forget(const void* owner) {
  std::lock_guard<std::mutex> lock(mu_);
  owners_.erase(Key(owner));
}

void GraphRanges::ForEach(const void* owner, absl::FunctionRef<void(Range)> visit) const {
  std::vector<Range> ranges;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = owners_.find(Key(owner));
    if (it != owners_.end()) ranges = it->second;
    ranges.insert(ranges.end(), stray_.begin(), stray_.end());
  }
  for (const Range& r : ranges) visit(r);
}

GraphRanges& Graphs() {
  static GraphRanges* const graphs = new GraphRanges;  // never destroyed: hooks run until the end
  return *graphs;
}

}  // namespace lazypin
