// Property tests of the pool: thousands of random operations on a small
// address space, every program-visible result compared with what the program
// would see without lazypin, and the invariants of driver_model.h checked
// after every step. Then a multi-threaded stress against a thread-safe driver.
#include <atomic>
#include <mutex>
#include <thread>

#include "driver_model.h"
#include "gtest/gtest.h"
#include "pool.h"

namespace lazypin {
namespace {

using model::DriverModel;
using model::HarnessOptions;
using model::kPage;
using model::PoolHarness;
using model::RngSource;

struct Scenario {
  const char* name;
  uintptr_t granularity;
  uint64_t capacity;
  uint64_t max_bytes;
  uint64_t max_entries;
  bool check_frames;
};

void PrintTo(const Scenario& s, std::ostream* os) { *os << s.name; }

class PoolPropertyTest : public ::testing::TestWithParam<Scenario> {};

// With copies that auto-pin mixed in (LAZYPIN_AUTOPIN): every program-visible
// result is still the bare driver's, nothing leaks, the bounds hold.
TEST(PoolAutoPinPropertyTest, CopiesThatPinChangeNothingTheProgramSees) {
  uint64_t pins = 0, autopin_hits = 0, copies = 0;
  for (int seed = 1; seed <= 60; ++seed) {
    HarnessOptions options;
    options.autopin = true;
    options.granularity = seed % 3 == 0 ? kPage : 1;
    options.limits.max_entries = seed % 4 == 0 ? 3 : 65536;
    options.limits.max_bytes = seed % 5 == 0 ? 3 * kPage : uint64_t{1} << 40;
    options.autopin_bytes = seed % 2 == 0 ? 2 * kPage : ~uint64_t{0};
    options.limits.check_frames = seed % 6 == 1;
    options.remaps = options.limits.check_frames;
    PoolHarness h(options);
    RngSource src(static_cast<uint64_t>(seed) * 0xD1B54A32D192ED03ull);
    const std::string error = model::RunOps(h, src, 2000, [] { return false; });
    ASSERT_EQ(error, "") << "seed " << seed;
    const PoolCounters c = h.pool().Counters();
    pins += c.autopins;
    autopin_hits += c.autopin_hits;
    copies += c.autopin_copies;
  }
  EXPECT_GT(pins, 1000u);
  EXPECT_GT(autopin_hits, 50u);
  EXPECT_GT(copies, 100u);
}

TEST_P(PoolPropertyTest, MatchesTheDriverWithoutLazypin) {
  const Scenario& s = GetParam();
  constexpr int kSeeds = 50;
  constexpr int kOps = 2000;
  uint64_t hits = 0, deferrals = 0, warnings = 0;
  uint64_t evictions[static_cast<int>(EvictReason::kCount)] = {};
  for (int seed = 1; seed <= kSeeds; ++seed) {
    HarnessOptions options;
    options.granularity = s.granularity;
    options.capacity = s.capacity;
    options.limits.max_bytes = s.max_bytes;
    options.limits.max_entries = s.max_entries;
    options.limits.check_frames = s.check_frames;
    options.remaps = s.check_frames;
    PoolHarness h(options);
    RngSource src(static_cast<uint64_t>(seed) * 0x9E3779B97F4A7C15ull + s.granularity);
    const std::string error = model::RunOps(h, src, kOps, [] { return false; });
    ASSERT_EQ(error, "") << "scenario " << s.name << ", seed " << seed;
    hits += h.hits();
    deferrals += h.deferrals();
    warnings += h.warnings();
    const PoolCounters c = h.pool().Counters();
    for (int r = 0; r < static_cast<int>(EvictReason::kCount); ++r) evictions[r] += c.evictions[r];
  }
  // The run exercised what it claims to check.
  EXPECT_GT(hits, 200u);
  EXPECT_GT(deferrals, 2000u);
  EXPECT_GT(evictions[static_cast<int>(EvictReason::kOverlap)], 0u);
  EXPECT_GT(evictions[static_cast<int>(EvictReason::kIdle)], 0u);
  EXPECT_GT(evictions[static_cast<int>(EvictReason::kContext)], 0u);
  EXPECT_GT(evictions[static_cast<int>(EvictReason::kFree)] +
                evictions[static_cast<int>(EvictReason::kMunmap)],
            0u);
  if (s.max_entries <= 3) {
    EXPECT_GT(evictions[static_cast<int>(EvictReason::kLru)], 0u);
  }
  if (s.capacity < ~uint64_t{0}) {
    EXPECT_GT(evictions[static_cast<int>(EvictReason::kMakeRoom)], 0u);
  }
  if (s.check_frames) {
    EXPECT_GT(evictions[static_cast<int>(EvictReason::kPfn)], 0u);
    EXPECT_GT(warnings, 0u);
  } else {
    EXPECT_EQ(warnings, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Scenarios, PoolPropertyTest,
    ::testing::Values(
        Scenario{"bytes", 1, ~uint64_t{0}, 1 << 20, 1 << 10, false},
        Scenario{"pages", kPage, ~uint64_t{0}, 1 << 20, 1 << 10, false},
        Scenario{"tight_bounds", 1, ~uint64_t{0}, 2 * kPage, 3, false},
        Scenario{"pages_tight", kPage, ~uint64_t{0}, kPage + 100, 2, false},
        Scenario{"out_of_memory", 1, 2 * kPage + 512, 1 << 20, 1 << 10, false},
        Scenario{"check_frames", kPage, ~uint64_t{0}, 1 << 20, 4, true}),
    [](const ::testing::TestParamInfo<Scenario>& info) { return std::string(info.param.name); });

// ---------------------------------------------------------------------------
// Multi-threaded stress. Each thread works on a private region and on shared
// chunks (irregular, page-sharing, guarded by a per-chunk lock so that the
// program's view of each is well defined), while all threads also invalidate
// random ranges anywhere, collect idle entries and release everything, so the
// pool sees real concurrency on every page. Every program-visible result is
// checked against a per-region model (the driver overlap rule is bytewise, so
// a region's results depend on that region alone).

class ThreadSafeDriver final : public PoolDriver {
 public:
  int Register(uintptr_t ptr, size_t bytes, unsigned flags, Context ctx) {
    std::lock_guard<std::mutex> lock(mu_);
    return model_.Register(ptr, bytes, flags, ctx);
  }
  int ProgramUnregister(uintptr_t ptr) {
    std::lock_guard<std::mutex> lock(mu_);
    return model_.Unregister(ptr);
  }
  int Unregister(uintptr_t ptr, Context, ReleaseWait*) override {
    std::lock_guard<std::mutex> lock(mu_);
    const int result = model_.Unregister(ptr);
    if (result != 0) eviction_failures_.fetch_add(1);
    return result;
  }
  bool ReadFrames(uintptr_t, size_t, std::vector<uint64_t>*) override { return false; }
  int64_t NowNs() override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  std::map<uintptr_t, model::Registration> Snapshot() {
    std::lock_guard<std::mutex> lock(mu_);
    return model_.regs();
  }
  int eviction_failures() const { return eviction_failures_.load(); }

 private:
  std::mutex mu_;
  DriverModel model_;
  std::atomic<int> eviction_failures_{0};
};

struct Region {
  uintptr_t lo = 0;
  size_t bytes = 0;
  std::mutex mu;      // held across a program call on this region
  DriverModel view;   // the program's registrations in it, without lazypin
};

TEST(PoolStressTest, EightThreadsPrivateAndSharedRanges) {
  constexpr int kThreads = 8;
  constexpr int kOpsPerThread = 20000;
  constexpr uintptr_t kArena = 0x40000000;
  constexpr size_t kPrivatePages = 6;
  constexpr int kChunks = 24;
  constexpr size_t kChunkBytes = 1365;  // odd: chunks share pages with neighbours

  ThreadSafeDriver driver;
  PoolLimits limits = DefaultPoolLimits();
  limits.max_entries = 40;
  limits.max_bytes = 24 * kPage;
  Pool pool(&driver, nullptr, limits);

  std::vector<std::unique_ptr<Region>> regions;
  for (int t = 0; t < kThreads; ++t) {
    auto r = std::make_unique<Region>();
    r->lo = kArena + t * 8 * kPage;
    r->bytes = kPrivatePages * kPage;
    regions.push_back(std::move(r));
  }
  const uintptr_t shared_lo = kArena + kThreads * 8 * kPage + 100;
  for (int c = 0; c < kChunks; ++c) {
    auto r = std::make_unique<Region>();
    r->lo = shared_lo + c * kChunkBytes;
    r->bytes = kChunkBytes;
    regions.push_back(std::move(r));
  }
  const uintptr_t arena_hi = shared_lo + kChunks * kChunkBytes;

  std::atomic<int> divergences{0};
  std::atomic<uint64_t> hits{0}, deferrals{0};
  std::mutex first_error_mu;
  std::string first_error;

  auto worker = [&](int t) {
    RngSource rng(1000 + t);
    std::vector<std::pair<uintptr_t, size_t>> recent;
    for (int i = 0; i < kOpsPerThread; ++i) {
      const uint64_t k = rng.Next(100);
      if (k < 85) {
        // A program call on the private region (2/3) or a shared chunk (1/3).
        Region& r = rng.Next(3) != 0 ? *regions[t] : *regions[kThreads + rng.Next(kChunks)];
        std::lock_guard<std::mutex> lock(r.mu);
        const Context ctx = model::ContextOf(0);
        int got = 0, want = 0;
        const char* what = "";
        if (k < 45) {
          uintptr_t ptr;
          size_t bytes;
          if (!recent.empty() && rng.Next(2) == 0) {
            const auto& p = recent[rng.Next(recent.size())];
            ptr = p.first;
            bytes = p.second;
          } else {
            ptr = r.lo + rng.Next(r.bytes);
            bytes = 1 + rng.Next(std::min<size_t>(r.lo + r.bytes - ptr, 2 * kPage));
          }
          if (ptr < r.lo || ptr + bytes > r.lo + r.bytes) continue;  // recent from elsewhere
          RegisterRequest req{ptr, bytes, 0, ctx, 0};
          const Outcome out =
              pool.Register(req, [&] { return driver.Register(ptr, bytes, 0, ctx); });
          got = out.result;
          want = r.view.Register(ptr, bytes, 0, ctx);
          if (out.action == Action::kHit) hits.fetch_add(1);
          if (got == 0) {
            recent.emplace_back(ptr, bytes);
            if (recent.size() > 8) recent.erase(recent.begin());
          }
          what = "register";
        } else {
          uintptr_t ptr = r.lo + rng.Next(r.bytes);
          if (!r.view.regs().empty() && rng.Next(4) != 0) {
            auto it = r.view.regs().begin();
            std::advance(it, rng.Next(r.view.regs().size()));
            ptr = it->first;
          }
          const Outcome out = pool.Unregister(ptr, [&] { return driver.ProgramUnregister(ptr); });
          got = out.result;
          want = r.view.Unregister(ptr);
          if (out.action == Action::kDeferred) deferrals.fetch_add(1);
          what = "unregister";
        }
        if (got != want) {
          divergences.fetch_add(1);
          std::lock_guard<std::mutex> elock(first_error_mu);
          if (first_error.empty()) {
            first_error = absl::StrFormat("thread %d op %d: %s got %d, want %d", t, i, what, got,
                                          want);
          }
        }
      } else if (k < 97) {
        const uintptr_t lo = kArena + rng.Next(arena_hi - kArena);
        pool.Invalidate(lo, lo + 1 + rng.Next(2 * kPage), EvictReason::kFree);
      } else if (k < 99) {
        pool.CollectIdle(static_cast<int64_t>(rng.Next(200'000)));
      } else {
        pool.ReleaseAll(EvictReason::kExit);
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();

  EXPECT_EQ(divergences.load(), 0) << first_error;
  EXPECT_EQ(driver.eviction_failures(), 0);
  EXPECT_GT(hits.load(), 100u);
  EXPECT_GT(deferrals.load(), 100u);

  // The driver holds exactly the program's view plus what is pooled.
  std::map<uintptr_t, model::Registration> program;
  for (const auto& r : regions) program.insert(r->view.regs().begin(), r->view.regs().end());
  const auto held = driver.Snapshot();
  uint64_t extra_entries = 0, extra_bytes = 0;
  for (const auto& [base, reg] : program) {
    auto it = held.find(base);
    ASSERT_TRUE(it != held.end() && it->second.bytes == reg.bytes)
        << "the program's 0x" << std::hex << base << " is missing from the driver";
  }
  for (const auto& [base, reg] : held) {
    if (program.count(base) == 0) {
      extra_entries += 1;
      extra_bytes += reg.bytes;
    }
  }
  const PoolCounters c = pool.Counters();
  EXPECT_EQ(c.pooled_entries, extra_entries);
  EXPECT_EQ(c.pooled_bytes, extra_bytes);
  EXPECT_LE(c.pooled_entries, limits.max_entries);
  EXPECT_EQ(pool.Empty(), extra_entries == 0);
  EXPECT_EQ(c.hits, hits.load());
  EXPECT_EQ(c.deferred, deferrals.load());

  // Releasing the pool leaves the driver with exactly the program's view.
  pool.ReleaseAll(EvictReason::kExit);
  EXPECT_EQ(driver.Snapshot().size(), program.size());
  EXPECT_TRUE(pool.Empty());
  EXPECT_EQ(driver.eviction_failures(), 0);
}

}  // namespace
}  // namespace lazypin
