// memory_budget: kept memory yields to the program (see memory_budget.h).
#include "memory_budget.h"

#include <climits>

#include "sys.h"

namespace lazypin {

int64_t MemoryBudget::Read() {
  const int64_t headroom = headroom_(headroom_arg_);
  const int64_t slack =
      headroom == INT64_MAX ? INT64_MAX / 2 : headroom - static_cast<int64_t>(margin_);
  slack_.store(slack, std::memory_order_relaxed);
  tight_.store(slack < 0, std::memory_order_relaxed);
  read_at_ns_.store(MonotonicNs(), std::memory_order_relaxed);
  last_headroom_.store(headroom, std::memory_order_relaxed);
  return headroom;
}

int64_t MemoryBudget::PollIntervalMs(uint64_t need) const {
  const int64_t headroom = last_headroom_.load(std::memory_order_relaxed);
  if (headroom == INT64_MAX) return 1000;
  const int64_t surplus = headroom - static_cast<int64_t>(need);
  if (surplus <= 0) return kPollMs;
  const int64_t ms = surplus / (kFastestGrowth / 1000);
  return ms < kPollMs ? kPollMs : ms > 1000 ? 1000 : ms;
}

bool MemoryBudget::MayKeep() {
  const int64_t now = MonotonicNs();
  if (now - read_at_ns_.load(std::memory_order_relaxed) > kPollMs * 1000000) Read();
  if (Tight()) return false;
  if (!polling_.load(std::memory_order_relaxed) &&
      !kept_signal_.exchange(true, std::memory_order_relaxed) && wake_ != nullptr) {
    wake_(wake_arg_);
  }
  return true;
}

uint64_t MemoryBudget::Announce(uint64_t bytes) {
  const int64_t b = static_cast<int64_t>(bytes);
  if (slack_.fetch_sub(b, std::memory_order_relaxed) - b >= 0) return 0;
  const int64_t headroom = Read();
  if (headroom == INT64_MAX || headroom - b >= static_cast<int64_t>(margin_)) {
    slack_.fetch_sub(b, std::memory_order_relaxed);
    return 0;
  }
  return bytes + margin_;
}

uint64_t MemoryBudget::ShortOf(uint64_t need) {
  const int64_t headroom = Read();
  const int64_t n = static_cast<int64_t>(need);
  return headroom >= n ? 0 : static_cast<uint64_t>(n - headroom);
}

}  // namespace lazypin
