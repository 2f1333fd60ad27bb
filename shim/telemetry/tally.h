// tally: exact aggregates of the per-call records a bounded log no longer
// writes (LAZYPIN_LOG_MAX). Past the bound the log keeps its header, stacks,
// warnings and summary, and instead of each call and evict record a "tally"
// record (docs/log-format.md) written kTallyFirstNs after the cut, then at
// doubling intervals up to kTallyEveryNs (so that a job of days adds a few
// MiB of them), and at exit: per
// group of calls, keyed as the report groups them (API, action, size class,
// result, warm, evicted inside, reason, call site), and per group of
// evictions (reason, error, forced), the count, errors, bytes, total time,
// sum of squared times, the longest and the latency histogram's non-empty
// buckets (LatencyHistogram's), cumulative since the cut. The report adds
// them to what it read from the records, so its tables stay exact; only the
// timeline (slowest calls, the pattern rules) ends at the cut.
//
// Not thread-safe: the log's writer thread (the Formatter) owns it, and the
// exit path after that thread has ended.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "stats.h"
#include "types.h"

namespace lazypin {

inline constexpr int64_t kTallyFirstNs = int64_t{10} * 1000 * 1000 * 1000;
inline constexpr int64_t kTallyEveryNs = int64_t{600} * 1000 * 1000 * 1000;

class Tally {
 public:
  void AddCall(Api api, Action action, size_t bytes, int result, int64_t latency_ns, int evicted,
               PassReason reason, int stack, const CallFacts& facts);
  void AddEvict(EvictReason reason, int result, bool forced, size_t bytes, int64_t latency_ns);
  // {"type":"tally","t_ns":..,"since_ns":..,"calls":[..],"evictions":[..]}, one line.
  std::string Record(int64_t t_ns, int64_t since_ns) const;
  bool empty() const { return calls_.empty() && evictions_.empty(); }

 private:
  struct Group {
    uint64_t n = 0, errors = 0, bytes = 0;
    int64_t total_ns = 0, max_ns = 0, in_call_evictions_ns = 0;
    double sq = 0;
    std::map<int, uint64_t> hist;
    void Add(size_t bytes, bool error, int64_t latency_ns);
  };
  // api, action, size class (-1: an unregister), result, warm, evicted inside, reason, stack
  using CallKey = std::tuple<int, int, int, int, bool, bool, int, int>;
  using EvictKey = std::tuple<int, bool, bool>;  // reason, error, forced
  std::map<CallKey, Group> calls_;
  std::map<EvictKey, Group> evictions_;
};

}  // namespace lazypin
