// stats: latency histograms and counters per API and per size class, and the
// summary (a JSON record for the log, a short table for stderr).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include <mutex>

#include "absl/base/thread_annotations.h"
#include "types.h"

namespace lazypin {

struct PoolCounters;
struct HostAllocCounters;

// Log-linear histogram of nanoseconds: 32 sub-buckets per power of two, so a
// percentile is within 1/32 (3.1%) of the true value.
class LatencyHistogram {
 public:
  void Add(int64_t ns);
  int64_t Percentile(double q) const;  // q in [0, 1]
  uint64_t count() const { return count_; }
  int64_t max() const { return max_; }

 private:
  static constexpr int kSubBits = 5;
  static constexpr int kBuckets = (64 - kSubBits + 1) << kSubBits;
  static int Index(uint64_t v);
  static uint64_t Midpoint(int index);
  std::array<uint32_t, kBuckets> buckets_ = {};
  uint64_t count_ = 0;
  int64_t max_ = 0;
};

struct CallStats {
  uint64_t calls = 0, errors = 0, bytes = 0;
  int64_t total_ns = 0;
  LatencyHistogram latency;
  void Add(size_t bytes, int result, int64_t latency_ns);
};

// Size classes for registers: <=4K, <=16K, ... <=4G (powers of 4), then "big".
constexpr int kSizeClasses = 12;
int SizeClass(size_t bytes);
const char* SizeClassName(int size_class);

class Stats {
 public:
  // One program call; `action` says whether the driver really did the work
  // (then its latency measures the driver, for the time-saved estimate).
  void RecordCall(Api api, size_t bytes, int result, int64_t latency_ns, Action action);
  void RecordEvict(int64_t latency_ns);
  // An auto-pin's register that the driver refused (the pool counts the rest).
  void RecordAutoPinFailure();

  // The summary record (one JSON line, without newline); `host` (the
  // host-allocation cache's counters, when there is one) adds "host_alloc".
  std::string SummaryJson(const PoolCounters& pool, int64_t t_ns, const char* ended_by,
                          const HostAllocCounters* host = nullptr) const;
  // The human summary for stderr.
  std::string SummaryText(const PoolCounters& pool, bool defer,
                          const HostAllocCounters* host = nullptr) const;

 private:
  int64_t SavedEstimateNs() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable std::mutex mu_;
  std::array<CallStats, static_cast<int>(Api::kCount)> by_api_ ABSL_GUARDED_BY(mu_);
  std::array<CallStats, kSizeClasses> by_size_ ABSL_GUARDED_BY(mu_);
  // Real driver work (counts and totals, no histogram: only means are
  // needed), for the estimate of what the pool saved.
  struct Total {
    uint64_t calls = 0;
    int64_t ns = 0;
    double Mean() const { return calls ? double(ns) / calls : 0.0; }
  };
  std::array<Total, kSizeClasses> real_register_by_size_ ABSL_GUARDED_BY(mu_);
  std::array<uint64_t, kSizeClasses> hits_by_size_ ABSL_GUARDED_BY(mu_) = {};
  Total real_unregister_ ABSL_GUARDED_BY(mu_);
  uint64_t deferred_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t evict_total_ns_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t autopin_failed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace lazypin
