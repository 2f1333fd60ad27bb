// stats: histograms, counters and the summary (see stats.h).
#include "stats.h"

#include <algorithm>
#include <cmath>

#include "auto_pin.h"
#include "fmt/format.h"
#include "host_alloc_cache.h"
#include "pool.h"

namespace lazypin {

int LatencyHistogram::Index(uint64_t v) {
  if (v < (uint64_t{1} << kSubBits)) return static_cast<int>(v);
  const int msb = 63 - __builtin_clzll(v);
  const int shift = msb - kSubBits;
  const int sub = static_cast<int>((v >> shift) & ((1u << kSubBits) - 1));
  return ((shift + 1) << kSubBits) + sub;
}

uint64_t LatencyHistogram::Midpoint(int index) {
  if (index < (1 << kSubBits)) return static_cast<uint64_t>(index);
  const int shift = (index >> kSubBits) - 1;
  const uint64_t sub = static_cast<uint64_t>(index & ((1 << kSubBits) - 1));
  const uint64_t lo = ((uint64_t{1} << kSubBits) | sub) << shift;
  return lo + ((uint64_t{1} << shift) >> 1);
}

void LatencyHistogram::Add(int64_t ns) {
  const uint64_t v = ns < 0 ? 0 : static_cast<uint64_t>(ns);
  const int i = std::min(Index(v), kBuckets - 1);
  buckets_[i] += 1;
  count_ += 1;
  max_ = std::max<int64_t>(max_, static_cast<int64_t>(v));
}

int64_t LatencyHistogram::Percentile(double q) const {
  if (count_ == 0) return 0;
  const uint64_t rank = std::max<uint64_t>(1, static_cast<uint64_t>(std::ceil(q * count_)));
  uint64_t seen = 0;
  for (int i = 0; i < kBuckets; ++i) {
    seen += buckets_[i];
    if (seen >= rank) return std::min<int64_t>(static_cast<int64_t>(Midpoint(i)), max_);
  }
  return max_;
}

void CallStats::Add(size_t n, int result, int64_t latency_ns) {
  calls += 1;
  errors += result != 0 ? 1 : 0;
  bytes += n;
  total_ns += latency_ns;
  latency.Add(latency_ns);
}

int SizeClass(size_t bytes) {
  size_t limit = 4096;
  for (int c = 0; c < kSizeClasses - 1; ++c, limit *= 4) {
    if (bytes <= limit) return c;
  }
  return kSizeClasses - 1;
}

const char* SizeClassName(int size_class) {
  static constexpr const char* kNames[kSizeClasses] = {"4K",  "16K",  "64K", "256K", "1M", "4M",
                                                       "16M", "64M", "256M", "1G",  "4G", "big"};
  return kNames[size_class];
}

CallFacts Stats::RecordCall(Api api, size_t bytes, int result, int64_t latency_ns, Action action,
                            int tid, int64_t t_ns, int evicted) {
  std::lock_guard<std::mutex> lock(mu_);
  CallFacts facts;
  by_api_[static_cast<int>(api)].Add(bytes, result, latency_ns);
  if (IsHostAllocApi(api)) return facts;  // the host-allocation cache counts its own (HostAllocCounters)
  if (evicted > 0) facts.in_call_evictions_ns = InCallEvictionsNs(tid, t_ns, latency_ns, evicted);
  const bool pooled = action == Action::kHit || action == Action::kDeferred;
  const int64_t net = pooled ? latency_ns - facts.in_call_evictions_ns : latency_ns;
  if (IsRegister(api)) {
    const int c = SizeClass(bytes);
    by_size_[c].Add(bytes, result, latency_ns);
    if (action == Action::kHit) hit_[c].Add(static_cast<double>(net));
    if (result == 0 && (action == Action::kMiss || action == Action::kForward)) {
      facts.warm = real_register_seen_ && evicted == 0;
      if (facts.warm) warm_register_[c].Add(static_cast<double>(latency_ns));
      real_register_seen_ = true;
    }
  } else {
    if (action == Action::kDeferred) deferred_.Add(static_cast<double>(net));
    if (result == 0 && (action == Action::kForward || action == Action::kPassthrough)) {
      real_unregister_.Add(static_cast<double>(latency_ns));
    }
  }
  return facts;
}

void Stats::RecordEvict(int64_t latency_ns, int result, int tid, int64_t t_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  evictions_ += 1;
  evictions_ns_ += latency_ns;
  if (result == 0) good_evictions_.Add(static_cast<double>(latency_ns));
  auto& recent = recent_evictions_[tid];
  if (recent.size() == kRecentEvictions) recent.erase(recent.begin());
  recent.emplace_back(t_ns, latency_ns);
}

int64_t Stats::InCallEvictionsNs(int tid, int64_t t_ns, int64_t latency_ns, int evicted) {
  auto it = recent_evictions_.find(tid);
  if (it == recent_evictions_.end()) return 0;
  int64_t ns = 0;
  int taken = 0;
  for (auto e = it->second.rbegin(); e != it->second.rend() && taken < evicted; ++e) {
    if (e->first < t_ns - latency_ns || e->first > t_ns) continue;
    ns += e->second;
    taken += 1;
  }
  return ns;
}

void Stats::RecordAutoPinFailure() {
  std::lock_guard<std::mutex> lock(mu_);
  autopin_failed_ += 1;
}

double Stats::Moments::VarianceOfMean() const {
  if (n < 2) return 0.0;
  const double var = (sumsq - sum * sum / n) / (n - 1);
  return var > 0 ? var / n : 0.0;
}

namespace {

// Without libm (the shim links libc alone): the report rounds and takes the
// root alike (round half away from zero; a root exact to an ulp).
int64_t RoundNs(double v) {
  return v >= 0 ? static_cast<int64_t>(v + 0.5) : -static_cast<int64_t>(-v + 0.5);
}

double Sqrt(double x) {
  if (!(x > 0)) return 0;
  double r = x > 1 ? x : 1;  // Newton's iteration from above decreases to the root
  for (int i = 0; i < 200; ++i) {
    const double next = 0.5 * (r + x / r);
    if (next >= r) break;
    r = next;
  }
  return r;
}

}  // namespace

Saving Stats::SavingEstimate() const {
  std::lock_guard<std::mutex> lock(mu_);
  return SavingLocked();
}

Saving Stats::SavingLocked() const {
  Saving out;
  double saved = 0, variance = 0;
  for (int c = 0; c < kSizeClasses; ++c) {
    const Moments& h = hit_[c];
    out.hits += h.n;
    if (h.n == 0 || warm_register_[c].n < kMinPriceCalls) continue;
    const Moments& p = warm_register_[c];
    out.hits_priced += h.n;
    out.price_calls += p.n;
    saved += h.n * p.Mean() - h.sum;
    variance += double(h.n) * double(h.n) * p.VarianceOfMean();
  }
  out.deferred = deferred_.n;
  const Moments& u = real_unregister_.n >= kMinPriceCalls ? real_unregister_ : good_evictions_;
  if (deferred_.n != 0 && u.n >= kMinPriceCalls) {
    out.deferred_priced = deferred_.n;
    out.price_calls += u.n;
    saved += deferred_.n * u.Mean() - deferred_.sum;
    variance += double(deferred_.n) * double(deferred_.n) * u.VarianceOfMean();
  }
  out.evictions = evictions_;
  out.evictions_ns = evictions_ns_;
  saved -= static_cast<double>(evictions_ns_);
  out.saved_ns = RoundNs(saved);
  out.spread_ns = RoundNs(2 * Sqrt(variance));
  return out;
}

namespace {

std::string FormatNum(double v) {
  if (v >= 100) return fmt::format("{:.0f}", v);
  if (v >= 10) return fmt::format("{:.1f}", v);
  return fmt::format("{:.2f}", v);
}

}  // namespace

std::string FormatNs(int64_t ns) {
  const uint64_t a = ns < 0 ? 0 - static_cast<uint64_t>(ns) : static_cast<uint64_t>(ns);
  std::string s;
  if (a < 1000) {
    s = fmt::format("{} ns", a);
  } else if (a < 1000'000) {
    s = FormatNum(a / 1e3) + " us";
  } else if (a < 1000'000'000) {
    s = FormatNum(a / 1e6) + " ms";
  } else {
    s = FormatNum(a / 1e9) + " s";
  }
  return ns < 0 ? "-" + s : s;
}

std::string SavingText(const Saving& s) {
  if (s.Idle()) return "saved nothing (no register hit the pool and no unregister was deferred)";
  if (!s.Estimable()) {
    return fmt::format(
        "saving not estimable (fewer than {} real calls of a kind in this process to price the "
        "hits and deferrals): measure it with --compare against a bare run",
        kMinPriceCalls);
  }
  std::string out = s.saved_ns >= 0 ? "saved " + FormatNs(s.saved_ns)
                                    : "cost " + FormatNs(-s.saved_ns) + " more than it saved";
  if (s.spread_ns > 0) out += " +/- " + FormatNs(s.spread_ns);
  out += fmt::format(" (estimated from {} real call{} of this run", s.price_calls,
                     s.price_calls == 1 ? "" : "s");
  const uint64_t unpriced = (s.hits - s.hits_priced) + (s.deferred - s.deferred_priced);
  if (unpriced != 0) out += fmt::format("; {} hits/deferrals unpriced, counted as 0", unpriced);
  return out + ")";
}

AutoPinSaving AutoPinSavingOf(const AutoPinCopyStats& copies, int64_t register_ns) {
  AutoPinSaving out;
  out.register_ns = register_ns;
  double saved = 0;
  for (int d = 0; d < 2; ++d) {
    const AutoPinCopyStats::Direction& c = copies.dir[d];
    AutoPinSaving::Direction& o = out.dir[d];
    o.bytes = c.pinned_rate_bytes;
    o.measured = c.pageable.bytes > 0 && c.pageable.ns > 0 && c.pinned.bytes > 0 && c.pinned.ns > 0;
    double per_byte;  // ns saved per byte copied at the pinned rate
    if (o.measured) {
      o.pageable_bytes_per_ns = double(c.pageable.bytes) / double(c.pageable.ns);
      o.pinned_bytes_per_ns = double(c.pinned.bytes) / double(c.pinned.ns);
      per_byte = double(c.pageable.ns) / double(c.pageable.bytes) -
                 double(c.pinned.ns) / double(c.pinned.bytes);
    } else {
      o.pageable_bytes_per_ns = kFixedPageableBytesPerNs;
      o.pinned_bytes_per_ns = kFixedPinnedBytesPerNs;
      per_byte = 1.0 / kFixedPageableBytesPerNs - 1.0 / kFixedPinnedBytesPerNs;
    }
    if (o.bytes != 0) saved += double(o.bytes) * per_byte;
  }
  out.saved_ns = static_cast<int64_t>(saved - double(register_ns));
  return out;
}

std::string AutoPinSavingText(const AutoPinSaving& s) {
  std::string out = s.saved_ns >= 0 ? "saved " + FormatNs(s.saved_ns) + " in copies"
                                    : "cost " + FormatNs(-s.saved_ns) + " more than it saved in copies";
  out += " (estimated: ";
  bool any = false;
  for (int d = 0; d < 2; ++d) {
    const AutoPinSaving::Direction& o = s.dir[d];
    if (o.bytes == 0) continue;
    out += fmt::format("{}{} bytes {} the device at the pinned rate, priced at ", any ? "; " : "",
                       o.bytes, d == 0 ? "to" : "from");
    out += o.measured ? "rates measured in this run"
                      : "fixed rates, an H200's (no synchronous pageable and pinned copy timed "
                        "in this run)";
    out += fmt::format(": pageable {:.1f} GB/s, pinned {:.1f} GB/s", o.pageable_bytes_per_ns,
                       o.pinned_bytes_per_ns);
    any = true;
  }
  if (!any) out += "no copy at the pinned rate";
  return out + "; minus its registers' " + FormatNs(s.register_ns) + ")";
}

namespace {

std::string CallStatsJson(const CallStats& s) {
  return fmt::format(
      R"({{"calls":{},"errors":{},"bytes":{},"total_ns":{},"p50_ns":{},"p90_ns":{},"p99_ns":{},"max_ns":{}}})",
      s.calls, s.errors, s.bytes, s.total_ns, s.latency.Percentile(0.5),
      s.latency.Percentile(0.9), s.latency.Percentile(0.99), s.latency.max());
}

}  // namespace

static std::string HostAllocJson(const HostAllocCounters& h) {
  std::string releases;
  for (int r = 0; r < static_cast<int>(EvictReason::kCount); ++r) {
    if (h.releases[r] == 0) continue;
    releases += fmt::format("{}\"{}\":{}", releases.empty() ? "" : ",",
                            EvictReasonName(static_cast<EvictReason>(r)), h.releases[r]);
  }
  return fmt::format(
      R"({{"hits":{},"misses":{},"kept":{},"forwarded_frees":{},"releases":{{{}}},"forgotten":{},)"
      R"("forced_releases":{},"cached_bytes":{},"cached_entries":{},"peak_bytes":{},)"
      R"("peak_entries":{},"zeroed_bytes":{},"zero_ns":{}}})",
      h.hits, h.misses, h.kept, h.forwarded_frees, releases, h.forgotten, h.forced_releases,
      h.cached_bytes, h.cached_entries, h.peak_bytes, h.peak_entries, h.zeroed_bytes, h.zero_ns);
}

namespace {

std::string TimedJson(const AutoPinCopyStats::Timed& t) {
  return fmt::format(R"({{"copies":{},"bytes":{},"ns":{}}})", t.copies, t.bytes, t.ns);
}

// ,"saved_ns":...,"copy_times":{"htod":{...},"dtoh":{...}} inside "autopin".
std::string AutoPinCopiesJson(const AutoPinCopyStats& c, int64_t register_ns) {
  std::string out = fmt::format(R"(,"saved_ns":{},"copy_times":{{)",
                                AutoPinSavingOf(c, register_ns).saved_ns);
  for (int d = 0; d < 2; ++d) {
    out += fmt::format(R"({}"{}":{{"pinned_rate_bytes":{},"pageable":{},"pinned":{}}})",
                       d ? "," : "", d ? "dtoh" : "htod", c.dir[d].pinned_rate_bytes,
                       TimedJson(c.dir[d].pageable), TimedJson(c.dir[d].pinned));
  }
  return out + "}";
}

}  // namespace

std::string Stats::SummaryJson(const PoolCounters& pool, int64_t t_ns, const char* ended_by,
                               const HostAllocCounters* host,
                               const AutoPinCopyStats* copies) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Saving saving = SavingLocked();
  std::string apis, sizes, evictions;
  for (int a = 0; a < static_cast<int>(Api::kCount); ++a) {
    if (by_api_[a].calls == 0) continue;
    apis += fmt::format("{}\"{}\":{}", apis.empty() ? "" : ",", ApiName(static_cast<Api>(a)),
                        CallStatsJson(by_api_[a]));
  }
  for (int c = 0; c < kSizeClasses; ++c) {
    if (by_size_[c].calls == 0) continue;
    sizes += fmt::format("{}\"{}\":{}", sizes.empty() ? "" : ",", SizeClassName(c),
                         CallStatsJson(by_size_[c]));
  }
  for (int r = 0; r < static_cast<int>(EvictReason::kCount); ++r) {
    if (pool.evictions[r] == 0) continue;
    evictions += fmt::format("{}\"{}\":{}", evictions.empty() ? "" : ",",
                             EvictReasonName(static_cast<EvictReason>(r)), pool.evictions[r]);
  }
  return fmt::format(
      R"({{"type":"summary","t_ns":{},"ended_by":"{}","apis":{{{}}},"size_classes":{{{}}},)"
      R"("pool":{{"hits":{},"misses":{},"deferred":{},"passed":{},"evictions":{{{}}},"forced_releases":{},)"
      R"("parked":{},"served":{},"served_zeroed":{},"peak_bytes":{},"peak_entries":{},"pooled_bytes":{},"pooled_entries":{},"saved_ns_est":{},)"
      R"("saving":{{"saved_ns":{},"spread_ns":{},"hits":{},"hits_priced":{},"deferred":{},)"
      R"("deferred_priced":{},"evictions":{},"evictions_ns":{},"price_calls":{}}},)"
      R"("autopin":{{"pins":{},"bytes":{},"register_ns":{},"failed":{},"copies":{},"copy_bytes":{},)"
      R"("hits":{},"full":{},"queried":{},"held_bytes":{}{}}}}}{}}})",
      t_ns, ended_by, apis, sizes, pool.hits, pool.misses, pool.deferred, pool.passed, evictions,
      pool.forced_releases, pool.parked, pool.served, pool.served_zeroed,
      pool.peak_bytes, pool.peak_entries, pool.pooled_bytes, pool.pooled_entries,
      saving.saved_ns, saving.saved_ns, saving.spread_ns, saving.hits, saving.hits_priced,
      saving.deferred, saving.deferred_priced, saving.evictions, saving.evictions_ns,
      saving.price_calls, pool.autopins, pool.autopin_bytes, pool.autopin_register_ns,
      autopin_failed_, pool.autopin_copies, pool.autopin_copy_bytes, pool.autopin_hits,
      pool.autopin_full, pool.autopin_queried, pool.autopinned_bytes,
      copies != nullptr ? AutoPinCopiesJson(*copies, pool.autopin_register_ns) : "",
      host != nullptr ? ",\"host_alloc\":" + HostAllocJson(*host) : "");
}

std::string Stats::SummaryText(const PoolCounters& pool, bool defer,
                               const HostAllocCounters* host,
                               const AutoPinCopyStats* copies) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out = fmt::format("lazypin: {:<22} {:>8} {:>6} {:>10} {:>10} {:>10}\n", "api",
                                "calls", "errors", "total", "p50", "p99");
  for (int a = 0; a < static_cast<int>(Api::kCount); ++a) {
    const CallStats& s = by_api_[a];
    if (s.calls == 0) continue;
    out += fmt::format("lazypin: {:<22} {:>8} {:>6} {:>10} {:>10} {:>10}\n",
                       ApiName(static_cast<Api>(a)), s.calls, s.errors, FormatNs(s.total_ns),
                       FormatNs(s.latency.Percentile(0.5)), FormatNs(s.latency.Percentile(0.99)));
  }
  if (defer) {
    uint64_t evicted = 0;
    for (uint64_t n : pool.evictions) evicted += n;
    const uint64_t registers = pool.hits + pool.misses;
    out += fmt::format(
        "lazypin: pool: {} hits / {} registers ({:.0f}%), {} deferred, {} passed through, {} "
        "evicted, peak {} entries / {} bytes, {}\n",
        pool.hits, registers, registers ? 100.0 * pool.hits / registers : 0.0, pool.deferred,
        pool.passed, evicted, pool.peak_entries, pool.peak_bytes, SavingText(SavingLocked()));
    if (pool.autopins + autopin_failed_ != 0) {
      out += fmt::format(
          "lazypin: autopin: {} ranges pinned ({} bytes, registers {}), {} later copies at the "
          "pinned rate ({} bytes), {} program registers served, {} refused, {} over the bound{}\n",
          pool.autopins, pool.autopin_bytes, FormatNs(pool.autopin_register_ns), pool.autopin_copies,
          pool.autopin_copy_bytes, pool.autopin_hits, autopin_failed_, pool.autopin_full,
          copies != nullptr
              ? ", " + AutoPinSavingText(AutoPinSavingOf(*copies, pool.autopin_register_ns))
              : "");
    }
  }
  if (host != nullptr && host->hits + host->misses + host->kept > 0) {
    uint64_t released = 0;
    for (uint64_t n : host->releases) released += n;
    const uint64_t allocs = host->hits + host->misses;
    out += fmt::format(
        "lazypin: host allocs: {} hits / {} allocations ({:.0f}%), {} frees kept, {} released, "
        "peak {} blocks / {} bytes, zeroing {}\n",
        host->hits, allocs, allocs ? 100.0 * host->hits / allocs : 0.0, host->kept, released,
        host->peak_entries, host->peak_bytes, FormatNs(host->zero_ns));
  }
  return out;
}

}  // namespace lazypin
