// tally: exact aggregates past the log's bound (see tally.h).
#include "tally.h"

#include <algorithm>

#include "fmt/format.h"

namespace lazypin {

void Tally::Group::Add(size_t b, bool error, int64_t latency_ns) {
  const int64_t v = std::max<int64_t>(0, latency_ns);
  n += 1;
  errors += error ? 1 : 0;
  bytes += b;
  total_ns += v;
  sq += static_cast<double>(v) * static_cast<double>(v);
  max_ns = std::max(max_ns, v);
  hist[LatencyHistogram::Index(static_cast<uint64_t>(v))] += 1;
}

void Tally::AddCall(Api api, Action action, size_t bytes, int result, int64_t latency_ns,
                    int evicted, PassReason reason, int stack, const CallFacts& facts) {
  const int size_class = IsRegister(api) ? SizeClass(bytes) : -1;
  Group& g = calls_[CallKey{static_cast<int>(api), static_cast<int>(action), size_class,
                            result, facts.warm, evicted > 0, static_cast<int>(reason), stack}];
  g.Add(bytes, result != 0, latency_ns);
  g.in_call_evictions_ns += facts.in_call_evictions_ns;
}

void Tally::AddEvict(EvictReason reason, int result, bool forced, size_t bytes, int64_t latency_ns) {
  evictions_[EvictKey{static_cast<int>(reason), result != 0, forced}].Add(bytes, result != 0,
                                                                          latency_ns);
}

namespace {

std::string Buckets(const std::map<int, uint64_t>& hist) {
  std::string out;
  for (const auto& [i, n] : hist) out += fmt::format("{}[{},{}]", out.empty() ? "" : ",", i, n);
  return out;
}

std::string Common(const char* sep, uint64_t n, uint64_t errors, uint64_t bytes, int64_t total,
                   double sq, int64_t max, const std::map<int, uint64_t>& hist) {
  return fmt::format(R"({}"n":{},"errors":{},"bytes":{},"total_ns":{},"sq":{:.17g},"max_ns":{},"hist":[{}])",
                     sep, n, errors, bytes, total, sq, max, Buckets(hist));
}

}  // namespace

std::string Tally::Record(int64_t t_ns, int64_t since_ns) const {
  std::string calls, evictions;
  for (const auto& [k, g] : calls_) {
    const auto& [api, action, size_class, result, warm, inside, reason, stack] = k;
    const PassReason r = static_cast<PassReason>(reason);
    calls += fmt::format(
        R"({}{{"api":"{}","action":"{}","size_class":{},"result":{},"warm":{},"evicted":{},)"
        R"("reason":{},"stack":{},"in_call_evictions_ns":{},{}}})",
        calls.empty() ? "" : ",", ApiName(static_cast<Api>(api)),
        ActionName(static_cast<Action>(action)),
        size_class < 0 ? std::string("null") : fmt::format("\"{}\"", SizeClassName(size_class)),
        result, warm, inside,
        r == PassReason::kNone ? std::string("null") : fmt::format("\"{}\"", PassReasonName(r)),
        stack, g.in_call_evictions_ns,
        Common("", g.n, g.errors, g.bytes, g.total_ns, g.sq, g.max_ns, g.hist));
  }
  for (const auto& [k, g] : evictions_) {
    const auto& [reason, error, forced] = k;
    evictions += fmt::format(R"({}{{"reason":"{}","error":{},"forced":{},{}}})",
                             evictions.empty() ? "" : ",",
                             EvictReasonName(static_cast<EvictReason>(reason)), error, forced,
                             Common("", g.n, g.errors, g.bytes, g.total_ns, g.sq, g.max_ns, g.hist));
  }
  return fmt::format(R"({{"type":"tally","t_ns":{},"since_ns":{},"calls":[{}],"evictions":[{}]}})",
                     t_ns, since_ns, calls, evictions);
}

}  // namespace lazypin
