// GranuleFilter: never a false negative, at every size class and across class
// boundaries; empty again once every range is removed.
#include "granule_filter.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace lazypin {
namespace {

constexpr uintptr_t kKiB = 1024, kMiB = kKiB * 1024, kGiB = kMiB * 1024;

TEST(GranuleFilter, EveryByteOfEveryAddedRangeIsMaybe) {
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

TEST(GranuleFilter, RandomRangesHaveNoFalseNegatives) {
  GranuleFilter filter;
  std::mt19937_64 rng(7);
  const uintptr_t base = uintptr_t{1} << 42;
  std::vector<std::pair<uintptr_t, uintptr_t>> live;
  for (int i = 0; i < 2000; ++i) {
    const uintptr_t lo = base + (rng() % (64 * kGiB)) / 4096 * 4096;
    const int shift = 12 + static_cast<int>(rng() % 20);  // 4 KiB .. 2 GiB
    const uintptr_t hi = lo + (uintptr_t{1} << shift) + (rng() % 3) * 4096;
    filter.Add(lo, hi);
    live.emplace_back(lo, hi);
    if (rng() % 3 == 0) {
      const size_t k = rng() % live.size();
      filter.Remove(live[k].first, live[k].second);
      live.erase(live.begin() + static_cast<long>(k));
    }
  }
  for (const auto& [lo, hi] : live) {
    const uintptr_t at = lo + (rng() % (hi - lo));
    ASSERT_TRUE(filter.MaybeOverlaps(at, at + 1));
  }
  for (const auto& [lo, hi] : live) filter.Remove(lo, hi);
  for (uintptr_t at = base; at < base + 68 * kGiB; at += 512 * kMiB) {
    ASSERT_FALSE(filter.MaybeOverlaps(at, at + 1)) << "empty again";
  }
}

}  // namespace
}  // namespace lazypin
