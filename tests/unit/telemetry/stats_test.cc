// Tests of the histogram, the size classes and the summary (shim/telemetry/stats.h).
#include "stats.h"
#include "auto_pin.h"
#include "tally.h"

#include "pool.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "fmt/format.h"
#include "gtest/gtest.h"

namespace lazypin {
namespace {

// ---------------------------------------------------------------------------
// A tiny strict JSON validator (RFC 8259 grammar, no extensions), enough to
// prove the summary line parses.
class JsonChecker {
 public:
  explicit JsonChecker(const std::string& s) : s_(s) {}
  bool Valid() {
    Ws();
    if (!Value()) return false;
    Ws();
    return i_ == s_.size();
  }

 private:
  bool Value() {
    if (i_ >= s_.size()) return false;
    switch (s_[i_]) {
      case '{': return Object();
      case '[': return Array();
      case '"': return String();
      case 't': return Literal("true");
      case 'f': return Literal("false");
      case 'n': return Literal("null");
      default: return Number();
    }
  }
  bool Object() {
    ++i_;
    Ws();
    if (Peek('}')) return ++i_, true;
    for (;;) {
      Ws();
      if (!String()) return false;
      Ws();
      if (!Peek(':')) return false;
      ++i_;
      Ws();
      if (!Value()) return false;
      Ws();
      if (Peek('}')) return ++i_, true;
      if (!Peek(',')) return false;
      ++i_;
    }
  }
  bool Array() {
    ++i_;
    Ws();
    if (Peek(']')) return ++i_, true;
    for (;;) {
      Ws();
      if (!Value()) return false;
      Ws();
      if (Peek(']')) return ++i_, true;
      if (!Peek(',')) return false;
      ++i_;
    }
  }
  bool String() {
    if (!Peek('"')) return false;
    for (++i_; i_ < s_.size(); ++i_) {
      const unsigned char c = s_[i_];
      if (c == '"') return ++i_, true;
      if (c < 0x20) return false;
      if (c == '\\') {
        if (++i_ >= s_.size()) return false;
        if (s_[i_] == 'u') {
          for (int k = 0; k < 4; ++k) {
            if (++i_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[i_]))) {
              return false;
            }
          }
        } else if (std::string("\"\\/bfnrt").find(s_[i_]) == std::string::npos) {
          return false;
        }
      }
    }
    return false;
  }
  bool Number() {
    const size_t start = i_;
    if (Peek('-')) ++i_;
    if (Peek('0')) {
      ++i_;
    } else if (!Digits()) {
      return false;
    }
    if (Peek('.')) {
      ++i_;
      if (!Digits()) return false;
    }
    if (Peek('e') || Peek('E')) {
      ++i_;
      if (Peek('+') || Peek('-')) ++i_;
      if (!Digits()) return false;
    }
    return i_ > start;
  }
  bool Digits() {
    const size_t start = i_;
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    return i_ > start;
  }
  bool Literal(const char* word) {
    const std::string w(word);
    if (s_.compare(i_, w.size(), w) != 0) return false;
    i_ += w.size();
    return true;
  }
  bool Peek(char c) const { return i_ < s_.size() && s_[i_] == c; }
  void Ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r')) {
      ++i_;
    }
  }
  const std::string& s_;
  size_t i_ = 0;
};

TEST(JsonCheckerTest, AcceptsJsonAndRejectsBrokenJson) {
  EXPECT_TRUE(JsonChecker(R"({"a":[1,-2.5e3,true,null,"x\"y"],"b":{}})").Valid());
  EXPECT_FALSE(JsonChecker(R"({"a":1,})").Valid());
  EXPECT_FALSE(JsonChecker(R"({"a":1)").Valid());
  EXPECT_FALSE(JsonChecker(R"({"a":01})").Valid());
  EXPECT_FALSE(JsonChecker(R"({a:1})").Valid());
  EXPECT_FALSE(JsonChecker(R"({"a":1}})").Valid());
}

// ---------------------------------------------------------------------------

int64_t ExactPercentile(std::vector<int64_t> v, double q) {
  std::sort(v.begin(), v.end());
  const size_t rank = std::max<size_t>(1, static_cast<size_t>(std::ceil(q * v.size())));
  return v[rank - 1];
}

TEST(LatencyHistogramTest, PercentilesWithinThreePointTwoPercentOfExact) {
  std::mt19937_64 rng(42);
  const std::vector<std::function<int64_t()>> distributions = {
      // log-uniform from 1 ns to 10 s: every octave of the histogram
      [&] { return static_cast<int64_t>(std::exp(std::uniform_real_distribution<>(0, 23)(rng))); },
      // a tight cluster, like the latency of one call
      [&] { return static_cast<int64_t>(std::normal_distribution<>(171000, 5000)(rng)); },
      // small values, below the linear range's end
      [&] { return static_cast<int64_t>(rng() % 100); },
      // bimodal: hits and misses
      [&] { return static_cast<int64_t>(rng() % 2 ? 300 + rng() % 50 : 2'000'000 + rng() % 99999); },
  };
  for (size_t d = 0; d < distributions.size(); ++d) {
    for (int n : {1, 7, 100, 10000, 100000}) {
      SCOPED_TRACE(testing::Message() << "distribution " << d << ", n=" << n);
      LatencyHistogram h;
      std::vector<int64_t> values;
      for (int i = 0; i < n; ++i) {
        const int64_t v = std::max<int64_t>(0, distributions[d]());
        values.push_back(v);
        h.Add(v);
      }
      EXPECT_EQ(h.count(), static_cast<uint64_t>(n));
      EXPECT_EQ(h.max(), *std::max_element(values.begin(), values.end())) << "max is exact";
      for (double q : {0.0, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0}) {
        const int64_t exact = ExactPercentile(values, q);
        const int64_t got = h.Percentile(q);
        EXPECT_LE(std::abs(static_cast<double>(got - exact)), 0.032 * exact + 0.5)
            << "q=" << q << " exact " << exact << " got " << got;
      }
    }
  }
}

TEST(LatencyHistogramTest, EdgeCases) {
  LatencyHistogram h;
  EXPECT_EQ(h.Percentile(0.5), 0) << "empty";
  EXPECT_EQ(h.max(), 0);
  h.Add(-5);  // a clock step backwards counts as 0
  EXPECT_EQ(h.Percentile(1.0), 0);
  h.Add(INT64_MAX);
  EXPECT_EQ(h.max(), INT64_MAX);
  EXPECT_LE(h.Percentile(1.0), INT64_MAX);
  EXPECT_GE(h.Percentile(1.0), static_cast<int64_t>(INT64_MAX * 0.968)) << "no overflow at the top";
  LatencyHistogram exact;
  for (int v = 0; v < 32; ++v) exact.Add(v);
  for (int v = 1; v <= 32; ++v) EXPECT_EQ(exact.Percentile(v / 32.0), v - 1) << "exact below 32";
}

TEST(SizeClassTest, BoundariesArePowersOfFourFrom4K) {
  const std::pair<uint64_t, const char*> cases[] = {
      {0, "4K"},
      {1, "4K"},
      {4096, "4K"},
      {4097, "16K"},
      {16384, "16K"},
      {16385, "64K"},
      {65536, "64K"},
      {65537, "256K"},
      {262144, "256K"},
      {262145, "1M"},
      {uint64_t{1} << 20, "1M"},
      {(uint64_t{1} << 20) + 1, "4M"},
      {uint64_t{4} << 20, "4M"},
      {uint64_t{16} << 20, "16M"},
      {(uint64_t{16} << 20) + 1, "64M"},
      {uint64_t{64} << 20, "64M"},
      {uint64_t{256} << 20, "256M"},
      {uint64_t{1} << 30, "1G"},
      {(uint64_t{1} << 30) + 1, "4G"},
      {uint64_t{4} << 30, "4G"},
      {(uint64_t{4} << 30) + 1, "big"},
      {~uint64_t{0}, "big"},
  };
  for (const auto& [bytes, name] : cases) {
    EXPECT_STREQ(SizeClassName(SizeClass(bytes)), name) << bytes;
  }
}

TEST(StatsTest, SummaryJsonIsValidAndComplete) {
  Stats s;
  s.RecordCall(Api::kCudaHostRegister, 4096, 0, 1000, Action::kMiss);
  s.RecordCall(Api::kCudaHostRegister, 4096, 0, 10, Action::kHit);
  s.RecordCall(Api::kCudaHostRegister, 4096, 0, 10, Action::kHit);
  s.RecordCall(Api::kCuMemHostRegisterV2, 8 << 20, 712, 50, Action::kMiss);
  s.RecordCall(Api::kCudaHostUnregister, 0, 0, 500, Action::kForward);
  s.RecordCall(Api::kCudaHostUnregister, 0, 0, 5, Action::kDeferred);
  s.RecordCall(Api::kCudaHostUnregister, 0, 0, 5, Action::kDeferred);
  s.RecordEvict(300);
  PoolCounters pool;
  pool.hits = 2;
  pool.misses = 2;
  pool.deferred = 2;
  pool.evictions[static_cast<int>(EvictReason::kLru)] = 1;
  pool.evictions[static_cast<int>(EvictReason::kMakeRoom)] = 3;
  pool.peak_bytes = 8192;
  pool.peak_entries = 2;
  pool.pooled_bytes = 4096;
  pool.pooled_entries = 1;

  const std::string json = s.SummaryJson(pool, 123456, "SIGTERM");
  EXPECT_TRUE(JsonChecker(json).Valid()) << json;
  EXPECT_EQ(json.find('\n'), std::string::npos) << "one line";
  for (const char* key :
       {R"("type":"summary")", R"("t_ns":123456)", R"("ended_by":"SIGTERM")", R"("apis":{)",
        R"("cudaHostRegister":{"calls":3,"errors":0,"bytes":12288,"total_ns":1020,)",
        R"("cuMemHostRegister_v2":{"calls":1,"errors":1,)", R"("cudaHostUnregister":{"calls":3,)",
        R"("size_classes":{"4K":{"calls":3,)", R"("16M":{"calls":1,)", R"("p50_ns":)",
        R"("p90_ns":)", R"("p99_ns":)", R"("max_ns":1000)", R"("pool":{"hits":2,"misses":2,"deferred":2,)",
        R"("evictions":{"lru":1,"make_room":3})", R"("peak_bytes":8192)", R"("peak_entries":2)",
        R"("pooled_bytes":4096)", R"("pooled_entries":1)"}) {
    EXPECT_NE(json.find(key), std::string::npos) << key << " missing from " << json;
  }
  EXPECT_EQ(json.find("cuMemHostUnregister"), std::string::npos) << "APIs never called are left out";
  EXPECT_EQ(json.find(R"("64K")"), std::string::npos) << "empty size classes are left out";
  // The first real register (1000) is the process's first: no warm 4K
  // register prices the hits; one real unregister and one eviction are too
  // few to price the deferrals (kMinPriceCalls): only the eviction counts.
  EXPECT_NE(json.find(R"("saved_ns_est":-300)"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("saving":{"saved_ns":-300,"spread_ns":0,"hits":2,"hits_priced":0,)"),
            std::string::npos)
      << json;

  const std::string text = s.SummaryText(pool, /*defer=*/true);
  EXPECT_NE(text.find("cudaHostRegister"), std::string::npos);
  EXPECT_NE(text.find("2 hits / 4 registers (50%)"), std::string::npos) << text;
  EXPECT_EQ(s.SummaryText(pool, false).find("pool:"), std::string::npos);
}

TEST(StatsTest, SavingPricesHitsAtTheMeanWarmRegisterOfTheirClass) {
  Stats s;
  s.RecordCall(Api::kCudaHostRegister, 4096, 0, 50000, Action::kMiss);  // first: left out
  s.RecordCall(Api::kCudaHostRegister, 4096, 0, 900, Action::kMiss);
  s.RecordCall(Api::kCudaHostRegister, 4096, 0, 1000, Action::kMiss);
  s.RecordCall(Api::kCudaHostRegister, 4096, 0, 1100, Action::kMiss);
  s.RecordCall(Api::kCudaHostRegister, 4096, 0, 7000, Action::kMiss, 1, 0, /*evicted=*/1);  // left out
  for (int i = 0; i < 10; ++i) s.RecordCall(Api::kCudaHostRegister, 4096, 0, 20, Action::kHit);
  s.RecordCall(Api::kCudaHostRegister, 1 << 20, 0, 20, Action::kHit);  // no warm 1M register
  const Saving v = s.SavingEstimate();
  EXPECT_EQ(v.hits, 11u);
  EXPECT_EQ(v.hits_priced, 10u);
  EXPECT_EQ(v.price_calls, 3u);
  EXPECT_EQ(v.saved_ns, 10 * 1000 - 10 * 20);
  // sample variance 10000, of the mean 3333.3; 2 x sqrt(100 x 3333.3) = 1154.7
  EXPECT_EQ(v.spread_ns, 1155);
  EXPECT_EQ(SavingText(v).substr(0, 18), "saved 9.80 us +/- ");
  EXPECT_NE(SavingText(v).find("(estimated from 3 real calls of this run; "
                               "1 hits/deferrals unpriced, counted as 0)"),
            std::string::npos);
}

TEST(StatsTest, SavingCountsAnEvictionInsideADeferralOnce) {
  Stats s;
  for (int i = 0; i < 3; ++i) s.RecordCall(Api::kCudaHostUnregister, 0, 0, 400, Action::kForward, 7, 1000);
  s.RecordEvict(/*latency_ns=*/300, 0, /*tid=*/7, /*t_ns=*/5000);  // inside the deferral below
  s.RecordEvict(/*latency_ns=*/200, 0, /*tid=*/8, /*t_ns=*/5000);  // another thread's
  s.RecordCall(Api::kCudaHostUnregister, 0, 0, 350, Action::kDeferred, 7, 5010, /*evicted=*/1);
  const Saving v = s.SavingEstimate();
  // the deferral: 400 - (350 - 300); evictions: 500
  EXPECT_EQ(v.saved_ns, 400 - 50 - 500);
  EXPECT_EQ(v.evictions, 2u);
  EXPECT_EQ(SavingText(v), "cost 150 ns more than it saved (estimated from 3 real calls of this run)");
}

TEST(StatsTest, SavingNotEstimableWithoutPrices) {
  Stats s;
  s.RecordCall(Api::kCudaHostRegister, 4096, 0, 1000, Action::kMiss);
  s.RecordCall(Api::kCudaHostRegister, 4096, 0, 10, Action::kHit);
  EXPECT_FALSE(s.SavingEstimate().Estimable());
  EXPECT_NE(SavingText(s.SavingEstimate()).find("not estimable"), std::string::npos);
}

TEST(StatsTest, AnIdlePoolSavedNothing) {
  Stats s;  // a program that keeps what it registers: misses only
  for (int i = 0; i < 4; ++i) s.RecordCall(Api::kCudaHostRegister, 4096, 0, 1000, Action::kMiss);
  const Saving v = s.SavingEstimate();
  EXPECT_TRUE(v.Estimable());
  EXPECT_EQ(v.saved_ns, 0);
  EXPECT_EQ(SavingText(v), "saved nothing (no register hit the pool and no unregister was deferred)");
}

TEST(StatsTest, FormatNsMatchesTheReport) {
  EXPECT_EQ(FormatNs(850), "850 ns");
  EXPECT_EQ(FormatNs(43210), "43.2 us");
  EXPECT_EQ(FormatNs(171000), "171 us");
  EXPECT_EQ(FormatNs(1900000), "1.90 ms");
  EXPECT_EQ(FormatNs(2310000000), "2.31 s");
  EXPECT_EQ(FormatNs(-1900000), "-1.90 ms");
}

TEST(StatsTest, EmptySummaryIsValidJson) {
  Stats s;
  const std::string json = s.SummaryJson(PoolCounters{}, 0, "exit");
  EXPECT_TRUE(JsonChecker(json).Valid()) << json;
  EXPECT_NE(json.find(R"("apis":{})"), std::string::npos);
  EXPECT_NE(json.find(R"("evictions":{})"), std::string::npos);
  EXPECT_NE(json.find(R"("saved_ns_est":0)"), std::string::npos);
}

TEST(StatsTest, AutoPinSavingAtMeasuredRatesElseTheFixedOnes) {
  AutoPinCopyStats c;
  // host to device: 10 GB/s pageable, 50 GB/s pinned, 1 GB at the pinned rate
  c.dir[0].pinned_rate_bytes = 1000000000;
  c.dir[0].pageable = {2, 2000000, 200000};
  c.dir[0].pinned = {4, 5000000, 100000};
  // device to host: pinned copies only (no pageable one timed): the fixed rates
  c.dir[1].pinned_rate_bytes = 53000000;
  c.dir[1].pinned = {1, 53000000, 1000000};
  const AutoPinSaving v = AutoPinSavingOf(c, 1000000);
  EXPECT_TRUE(v.dir[0].measured);
  EXPECT_FALSE(v.dir[1].measured);
  const double fixed = 53000000 * (1 / kFixedPageableBytesPerNs - 1 / kFixedPinnedBytesPerNs);
  EXPECT_EQ(v.saved_ns, static_cast<int64_t>(1e9 * (0.1 - 0.02) + fixed - 1e6));
  EXPECT_EQ(AutoPinSavingText(v),
            fmt::format("saved {} in copies (estimated: 1000000000 bytes to the device at the pinned "
                        "rate, priced at rates measured in this run: pageable 10.0 GB/s, pinned "
                        "50.0 GB/s; 53000000 bytes from the device at the pinned rate, priced at "
                        "fixed rates, an H200's (no synchronous pageable and pinned copy timed in "
                        "this run): pageable 6.5 GB/s, pinned 53.0 GB/s; minus its registers' "
                        "1.00 ms)",
                        FormatNs(v.saved_ns)));
  Stats s;
  const std::string json = s.SummaryJson(PoolCounters{}, 0, "exit", nullptr, &c);
  EXPECT_TRUE(JsonChecker(json).Valid()) << json;
  EXPECT_NE(json.find(R"("copy_times":{"htod":{"pinned_rate_bytes":1000000000,"pageable":)"
                      R"({"copies":2,"bytes":2000000,"ns":200000},)"),
            std::string::npos)
      << json;
  EXPECT_EQ(s.SummaryJson(PoolCounters{}, 0, "exit").find("copy_times"), std::string::npos)
      << "without auto-pin, no copy times";
}

TEST(TallyTest, RecordIsValidJsonWithTheGroupsAndBuckets) {
  Tally t;
  EXPECT_TRUE(t.empty());
  CallFacts warm;
  warm.warm = true;
  t.AddCall(Api::kCudaHostRegister, Action::kForward, 4096, 0, 1000, 0, PassReason::kNone, 3, warm);
  t.AddCall(Api::kCudaHostRegister, Action::kForward, 4096, 0, 1000, 0, PassReason::kNone, 3, warm);
  t.AddCall(Api::kCudaHostUnregister, Action::kPassthrough, 0, 0, 40, 0, PassReason::kShared, 0,
            CallFacts{});
  t.AddEvict(EvictReason::kLru, 0, true, 4096, 500);
  const std::string json = t.Record(2000, 1000);
  EXPECT_TRUE(JsonChecker(json).Valid()) << json;
  for (const char* key :
       {R"({"type":"tally","t_ns":2000,"since_ns":1000,)",
        R"("api":"cudaHostRegister","action":"forward","size_class":"4K","result":0,"warm":true,)",
        R"("n":2,"errors":0,"bytes":8192,"total_ns":2000,"sq":2000000,"max_ns":1000,)",
        R"("size_class":null,)", R"("reason":"shared")", R"("stack":3,)",
        R"("evictions":[{"reason":"lru","error":false,"forced":true,"n":1,)"}) {
    EXPECT_NE(json.find(key), std::string::npos) << key << " missing from " << json;
  }
  // the bucket of 1000 ns, as the histogram (and the report) index it
  EXPECT_NE(json.find(fmt::format("[{},2]", LatencyHistogram::Index(1000))), std::string::npos) << json;
}

TEST(StatsTest, ApiNamesAndKinds) {
  EXPECT_STREQ(ApiName(Api::kCuMemHostRegisterV2), "cuMemHostRegister_v2");
  EXPECT_TRUE(IsRegister(Api::kCuMemHostRegister));
  EXPECT_FALSE(IsRegister(Api::kCuMemHostUnregister));
}

}  // namespace
}  // namespace lazypin
