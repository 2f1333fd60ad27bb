// GranuleFilter (shim/core/granule_filter.h) against a reference model: the
// filter may say "maybe" where nothing overlaps (a false positive costs the
// pool's exact lookup) but never "no" where a range it holds overlaps.
#include "granule_filter.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace lazypin {
namespace {

constexpr uintptr_t kKiB = uintptr_t{1} << 10;
constexpr uintptr_t kMiB = uintptr_t{1} << 20;
constexpr uintptr_t kGiB = uintptr_t{1} << 30;

TEST(GranuleFilterTest, EmptySaysNoForAnyRange) {
  GranuleFilter filter;
  EXPECT_FALSE(filter.MaybeOverlaps(0x10000, 0x20000));
  EXPECT_FALSE(filter.MaybeOverlaps(0x7f0000000000, 0x7f0000000000 + 64 * kMiB));
  EXPECT_FALSE(filter.MaybeOverlaps(0x1000, 0x1000));  // empty range
}

TEST(GranuleFilterTest, AddedRangeOverlapsEveryByteAndRemoveForgetsIt) {
  GranuleFilter filter;
  const uintptr_t lo = 0x7f1234560000, hi = lo + 5 * kMiB + 4096;
  filter.Add(lo, hi);
  for (uintptr_t p = lo; p < hi; p += 4096) EXPECT_TRUE(filter.MaybeOverlaps(p, p + 1)) << p;
  EXPECT_TRUE(filter.MaybeOverlaps(lo - kGiB, hi + kGiB));  // a scan too long: "maybe"
  filter.Remove(lo, hi);
  EXPECT_FALSE(filter.MaybeOverlaps(lo, hi));
}

TEST(GranuleFilterTest, HugeRangesUseTheCoarseTableAndStayExactlyCounted) {
  GranuleFilter filter;
  const uintptr_t lo = 0x7e0000000000, hi = lo + 3 * kGiB + 12345;
  filter.Add(lo, hi);
  filter.Add(lo, hi);  // counted twice: one Remove keeps it
  EXPECT_TRUE(filter.MaybeOverlaps(hi - 1, hi));
  filter.Remove(lo, hi);
  EXPECT_TRUE(filter.MaybeOverlaps(lo + kGiB, lo + kGiB + 4096));
  filter.Remove(lo, hi);
  EXPECT_FALSE(filter.MaybeOverlaps(lo, lo + 4096));
}

// Ranges of each size class (2 MiB, 16 MiB, 1 GiB granules), at and across
// the class edges: every byte "maybe" while held, "no" once removed.
TEST(GranuleFilterTest, EverySizeClassAndItsEdgesSayMaybe) {
  GranuleFilter filter;
  const uintptr_t base = uintptr_t{1} << 40;
  struct R {
    uintptr_t lo, hi;
  };
  // Each class, its edges and ranges straddling granules of every class.
  const std::vector<R> ranges = {
      {base + 4 * kKiB, base + 8 * kKiB},
      {base + 2 * kMiB - 4 * kKiB, base + 2 * kMiB + 4 * kKiB},
      {base + 3 * kGiB - kMiB, base + 3 * kGiB + 15 * kMiB},          // just under 16 MiB
      {base + 5 * kGiB - 8 * kMiB, base + 5 * kGiB + 8 * kMiB},       // 16 MiB
      {base + 7 * kGiB + 100 * kKiB, base + 7 * kGiB + 255 * kMiB},   // mid class
      {base + 9 * kGiB - 128 * kMiB, base + 9 * kGiB + 128 * kMiB},   // 256 MiB: coarse
      {base + 20 * kGiB + 4 * kKiB, base + 24 * kGiB + 4 * kKiB},     // 4 GiB
  };
  for (const R& r : ranges) filter.Add(r.lo, r.hi);
  for (const R& r : ranges) {
    const uintptr_t len = r.hi - r.lo;
    for (uintptr_t off : {uintptr_t{0}, len / 3, len / 2, len - 1}) {
      EXPECT_TRUE(filter.MaybeOverlaps(r.lo + off, r.lo + off + 1)) << std::hex << r.lo << "+" << off;
    }
    EXPECT_TRUE(filter.MaybeOverlaps(r.lo - 64 * kKiB, r.lo + 1));
    EXPECT_TRUE(filter.MaybeOverlaps(r.hi - 1, r.hi + 64 * kKiB));
  }
  EXPECT_FALSE(filter.MaybeOverlaps(base + 50 * kGiB, base + 50 * kGiB + 4096)) << "far from all";
  for (const R& r : ranges) filter.Remove(r.lo, r.hi);
  for (const R& r : ranges) {
    EXPECT_FALSE(filter.MaybeOverlaps(r.lo, r.lo + 1)) << std::hex << r.lo;
    EXPECT_FALSE(filter.MaybeOverlaps(r.hi - 1, r.hi)) << std::hex << r.hi;
  }
}

// Random adds and removes of ranges of every size class against the set of
// ranges held: no false negative, and once all are removed, no positive.
TEST(GranuleFilterTest, NeverAFalseNegativeAgainstAModel) {
  GranuleFilter filter;
  std::mt19937_64 rng(7);
  std::vector<std::pair<uintptr_t, uintptr_t>> held;
  const uintptr_t base = 0x7f0000000000;
  auto random_range = [&] {
    const uintptr_t sizes[] = {4096, 64 * 1024, 3 * kMiB, 300 * kMiB, 2 * kGiB};
    const uintptr_t bytes = sizes[rng() % 5] + (rng() % 4) * 4096;
    const uintptr_t lo = base + (rng() % (uintptr_t{1} << 36)) / 4096 * 4096;
    return std::make_pair(lo, lo + bytes);
  };
  for (int step = 0; step < 20000; ++step) {
    if (held.empty() || rng() % 3 != 0) {
      held.push_back(random_range());
      filter.Add(held.back().first, held.back().second);
    } else {
      const size_t i = rng() % held.size();
      filter.Remove(held[i].first, held[i].second);
      held.erase(held.begin() + static_cast<long>(i));
    }
    const auto probe = random_range();
    bool overlaps = false;
    for (const auto& [lo, hi] : held) overlaps |= lo < probe.second && probe.first < hi;
    if (overlaps) ASSERT_TRUE(filter.MaybeOverlaps(probe.first, probe.second)) << step;
    if (!held.empty()) {
      const auto& [lo, hi] = held[rng() % held.size()];
      ASSERT_TRUE(filter.MaybeOverlaps(lo + (hi - lo) / 2, lo + (hi - lo) / 2 + 1)) << step;
    }
  }
  for (const auto& [lo, hi] : held) filter.Remove(lo, hi);
  for (int i = 0; i < 1000; ++i) {
    const auto probe = random_range();
    if (probe.second - probe.first < 256 * kMiB) {
      ASSERT_FALSE(filter.MaybeOverlaps(probe.first, probe.second));
    }
  }
}

}  // namespace
}  // namespace lazypin
