// stats: latency histograms and counters per API and per size class, and the
// summary (a JSON record for the log, a short table for stderr).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "types.h"

namespace lazypin {

struct PoolCounters;
struct HostAllocCounters;
struct AutoPinCopyStats;

// Log-linear histogram of nanoseconds: 32 sub-buckets per power of two, so a
// percentile is within 1/32 (3.1%) of the true value.
class LatencyHistogram {
 public:
  void Add(int64_t ns);
  int64_t Percentile(double q) const;  // q in [0, 1]
  uint64_t count() const { return count_; }
  int64_t max() const { return max_; }
  // The bucket of `v` (the report's hist_index reads the same buckets).
  static int Index(uint64_t v);

 private:
  static constexpr int kSubBits = 5;
  static constexpr int kBuckets = (64 - kSubBits + 1) << kSubBits;
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

// What the pool saved in one process: the one definition, shared with the
// report (scripts/lazypin_report/savings.py, saving_of; the report's tests hold the
// two to each other on the same logs). Estimated from this process's own
// calls, in the order the log holds them:
//   price of a hit: the mean warm real register of its size class (a
//     successful miss or forward that evicted nothing, the process's first
//     real register left out: it may pay for CUDA's start-up);
//   price of a deferred unregister: the mean successful real unregister
//     call, else (none forwarded) the mean successful eviction;
//   saved = sum over priced hits and deferrals of (price - the call's own
//     time, less any eviction made inside it) - every eviction's time.
// A price rests on at least kMinPriceCalls real calls: a hit or deferral
// without as many of its kind to price it counts 0 and is counted as
// unpriced (one cold call made estimates many times the run's length). spread_ns: two standard errors of the prices
// (about a 95% interval on the estimate); 0 where a price rests on one call.
inline constexpr uint64_t kMinPriceCalls = 3;
struct Saving {
  int64_t saved_ns = 0;
  int64_t spread_ns = 0;
  uint64_t hits = 0, hits_priced = 0;
  uint64_t deferred = 0, deferred_priced = 0;
  uint64_t evictions = 0;
  int64_t evictions_ns = 0;
  uint64_t price_calls = 0;  // the real calls the prices rest on
  // The pool did nothing: no hit, deferral or eviction, so it saved exactly 0.
  bool Idle() const { return hits + deferred + evictions == 0; }
  bool Estimable() const { return hits_priced + deferred_priced > 0 || hits + deferred == 0; }
};
// "saved 1.20 ms +/- 40.0 us (estimated ...)", or "saved nothing (...)"
// where the pool was idle: the line the exit summary and the report print
// alike.
std::string SavingText(const Saving& saving);
// The report's time format (850 ns, 43.2 us, 171 us, 1.90 ms, 2.31 s).
std::string FormatNs(int64_t ns);

// What auto-pin saved in copies: the one definition, shared with the report
// (scripts/lazypin_report/savings.py, autopin_saving; report_savings_agree
// holds the two to each other). Per direction (host to device, device to
// host), the bytes of the copies that ran at the pinned rate (AutoPinCopyStats:
// sync and async) times (pageable ns per byte - pinned ns per byte), the two
// rates measured in this run on the synchronous copies auto-pin timed: those
// it left pageable before pinning their range (LAZYPIN_AUTOPIN_AFTER of 2 or
// more) and those of ranges it held pinned. A direction without both timed
// is priced at the fixed rates below (an H200's: docs/benchmarks.md, 64 MiB
// pageable 9.4-11 ms, pinned 1.24-1.29 ms), and the text says so. Then minus
// the time of auto-pin's registers; summed in that order in doubles and
// truncated toward zero to whole nanoseconds.
inline constexpr double kFixedPageableBytesPerNs = 6.5;  // bytes per ns = GB/s
inline constexpr double kFixedPinnedBytesPerNs = 53.0;
struct AutoPinSaving {
  int64_t saved_ns = 0;
  int64_t register_ns = 0;
  struct Direction {
    uint64_t bytes = 0;     // copied at the pinned rate
    bool measured = false;  // both rates timed in this run (else the fixed ones)
    double pageable_bytes_per_ns = 0, pinned_bytes_per_ns = 0;
  };
  Direction dir[2];  // [0]: host to device, [1]: device to host
};
AutoPinSaving AutoPinSavingOf(const AutoPinCopyStats& copies, int64_t register_ns);
// "saved 3.10 ms in copies (estimated: ...)": the exit summary's and the report's.
std::string AutoPinSavingText(const AutoPinSaving& saving);

// What Stats::RecordCall found about one call, for the tally (tally.h).
struct CallFacts {
  bool warm = false;               // a warm real register (one that prices hits)
  int64_t in_call_evictions_ns = 0;  // the evictions made inside it
};

class Stats {
 public:
  // One program call; `action` says whether the driver really did the work
  // (then its latency measures the driver, for the time-saved estimate).
  // `tid`, `t_ns` (its end) and `evicted` place the evictions made inside it.
  CallFacts RecordCall(Api api, size_t bytes, int result, int64_t latency_ns, Action action,
                       int tid = 0, int64_t t_ns = 0, int evicted = 0);
  // One eviction (lazypin's real unregister), ended at `t_ns` on thread `tid`.
  void RecordEvict(int64_t latency_ns, int result = 0, int tid = 0, int64_t t_ns = 0);
  Saving SavingEstimate() const;
  // An auto-pin's register that the driver refused (the pool counts the rest).
  void RecordAutoPinFailure();

  // The summary record (one JSON line, without newline); `host` (the
  // host-allocation cache's counters, when there is one) adds "host_alloc".
  // `copies` (auto-pin's copy times, when auto-pin ran) adds its saving.
  std::string SummaryJson(const PoolCounters& pool, int64_t t_ns, const char* ended_by,
                          const HostAllocCounters* host = nullptr,
                          const AutoPinCopyStats* copies = nullptr) const;
  // The human summary for stderr.
  std::string SummaryText(const PoolCounters& pool, bool defer,
                          const HostAllocCounters* host = nullptr,
                          const AutoPinCopyStats* copies = nullptr) const;

 private:
  Saving SavingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The evictions a call of `tid` that ended at `t_ns` after `latency_ns`
  // made inside it (the last `evicted` of that thread's recent ones).
  int64_t InCallEvictionsNs(int tid, int64_t t_ns, int64_t latency_ns, int evicted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable std::mutex mu_;
  std::array<CallStats, static_cast<int>(Api::kCount)> by_api_ ABSL_GUARDED_BY(mu_);
  std::array<CallStats, kSizeClasses> by_size_ ABSL_GUARDED_BY(mu_);
  // Count, sum and sum of squares of latencies (Saving's prices).
  struct Moments {
    uint64_t n = 0;
    double sum = 0, sumsq = 0;
    void Add(double ns) { n += 1; sum += ns; sumsq += ns * ns; }
    double Mean() const { return n ? sum / n : 0.0; }
    // The variance of the mean: sample variance / n (0 below two samples).
    double VarianceOfMean() const;
  };
  std::array<Moments, kSizeClasses> warm_register_ ABSL_GUARDED_BY(mu_);
  std::array<Moments, kSizeClasses> hit_ ABSL_GUARDED_BY(mu_);  // net of in-call evictions
  Moments real_unregister_ ABSL_GUARDED_BY(mu_);
  Moments good_evictions_ ABSL_GUARDED_BY(mu_);
  Moments deferred_ ABSL_GUARDED_BY(mu_);  // net of in-call evictions
  uint64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t evictions_ns_ ABSL_GUARDED_BY(mu_) = 0;
  bool real_register_seen_ ABSL_GUARDED_BY(mu_) = false;
  // Per thread, its last kRecentEvictions evictions (end time, latency).
  static constexpr size_t kRecentEvictions = 16;
  std::unordered_map<int, std::vector<std::pair<int64_t, int64_t>>> recent_evictions_
      ABSL_GUARDED_BY(mu_);
  uint64_t autopin_failed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace lazypin
