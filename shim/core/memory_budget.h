// memory_budget: what lazypin keeps beyond what the program holds yields to
// the program's own demand. Kept memory is memory the program gave back and
// lazypin did not: pinned host blocks freed with cudaFreeHost/cuMemFreeHost
// (host_alloc_cache.h) and freed malloc blocks parked for reuse (Pool::Park).
//
// The rule (docs/design.md, "Kept memory yields"): while anything is kept, the
// headroom (the bytes the program can still get: its memory cgroup's limit
// less its usage, and the machine's MemAvailable, whichever is less) stays at
// least `margin`, and an allocation the hooks see being made (malloc & co. of
// kAnnounceMin bytes or more, mmap with MAP_POPULATE) first gets its bytes on
// top of that. Nothing is kept while the headroom is under the margin. The
// collector releases kept memory, least recently kept first, when a reading
// falls short: on an announced allocation (the caller waits for it) and every
// PollIntervalMs (5 ms to 1 s, by how long the surplus lasts) while anything
// is kept.
#pragma once

#include <atomic>
#include <cstdint>

namespace lazypin {

class MemoryBudget {
 public:
  // Allocations smaller than this are not announced (the poll sees them).
  static constexpr uint64_t kAnnounceMin = uint64_t{1} << 20;
  // How often the collector reads the headroom while anything is kept.
  static constexpr int64_t kPollMs = 5;
  // The allocation hooks' gauge (hooks_alloc.h): parked blocks count 1 each
  // (low 32 bits), kept host blocks kKeptUnit each.
  static constexpr int64_t kKeptUnit = int64_t{1} << 32;

  // The headroom now: the bytes the program can still get (INT64_MAX:
  // unknown). os/memory_limit's MemoryProbe::HeadroomOf, injected.
  using HeadroomFn = int64_t (*)(const void* arg);
  // `gauge` is the allocation hooks' word.
  MemoryBudget(HeadroomFn headroom, const void* arg, uint64_t margin, std::atomic<int64_t>* gauge)
      : headroom_(headroom), headroom_arg_(arg), margin_(margin), gauge_(gauge) {}

  uint64_t margin() const { return margin_; }
  std::atomic<int64_t>* gauge() const { return gauge_; }
  // Cheap: anything is kept (the collector polls).
  bool Keeping() const { return gauge_->load(std::memory_order_relaxed) != 0; }
  // Cheap: the last reading found the headroom under the margin.
  bool Tight() const { return tight_.load(std::memory_order_relaxed); }

  // Something the program gave back is about to be kept: true if the
  // headroom (a reading at most kPollMs old) is at least the margin. Wakes
  // the collector, unless it polls already, so that it polls from now on.
  // Async-signal-safe.
  bool MayKeep();
  // The program is making an allocation of `bytes`: 0 if the headroom covers
  // it and the margin (mostly no reading: the slack left since the last one
  // is counted down), else the headroom to reach first.
  uint64_t Announce(uint64_t bytes);
  // A fresh reading: how many bytes the headroom is short of `need` (0: none).
  uint64_t ShortOf(uint64_t need);
  // How long the poll may wait before its next reading when the headroom is
  // `need` or more at the last one: the time the surplus lasts at
  // kFastestGrowth, from kPollMs to 1 s (fewer readings, and fewer files
  // opened for them, while memory is plentiful).
  int64_t PollIntervalMs(uint64_t need) const;
  // The fastest growth the poll plans for: many threads faulting in fresh
  // pages (one thread: 1-2 GB/s on the development VM, 13 GB/s at most seen).
  static constexpr int64_t kFastestGrowth = int64_t{20} << 30;  // bytes per second
  // The collector: true once after MayKeep let something be kept (poll now,
  // even before the gauge shows it).
  bool TakeKeptSignal() { return kept_signal_.exchange(false, std::memory_order_relaxed); }
  // The collector says whether it is polling (then MayKeep wakes nobody: a
  // program that frees and allocates in a loop pays no wake-up per cycle).
  void SetPolling(bool polling) { polling_.store(polling, std::memory_order_relaxed); }
  // Who to wake when something starts being kept (the collector).
  void SetWaker(void (*wake)(void*), void* arg) {
    wake_arg_ = arg;
    wake_ = wake;
  }

 private:
  int64_t Read();

  const HeadroomFn headroom_;
  const void* const headroom_arg_;
  const uint64_t margin_;
  std::atomic<int64_t>* const gauge_;
  std::atomic<bool> tight_{false};
  // Headroom less the margin at the last reading, less the bytes announced since.
  std::atomic<int64_t> slack_{0};
  std::atomic<int64_t> read_at_ns_{0};
  std::atomic<int64_t> last_headroom_{INT64_MAX};
  std::atomic<bool> kept_signal_{false};
  std::atomic<bool> polling_{false};
  void (*wake_)(void*) = nullptr;
  void* wake_arg_ = nullptr;
};

}  // namespace lazypin
