// GraphRanges (shim/graph_ranges.h): which host ranges each graph and
// executable graph copies, as the graph hooks note them.
#include "graph_ranges.h"

#include <vector>

#include "gtest/gtest.h"

namespace lazypin {
namespace {

using Range = GraphRanges::Range;

std::vector<std::pair<uintptr_t, uintptr_t>> Of(const GraphRanges& g, const void* owner) {
  std::vector<std::pair<uintptr_t, uintptr_t>> out;
  g.ForEach(owner, [&](Range r) { out.emplace_back(r.lo, r.hi); });
  return out;
}

const void* const kGraph = reinterpret_cast<const void*>(0x1000);
const void* const kExec = reinterpret_cast<const void*>(0x2000);
const void* const kOther = reinterpret_cast<const void*>(0x3000);

TEST(GraphRanges, NothingNotedCostsNothing) {
  GraphRanges g;
  EXPECT_FALSE(g.Any());
  EXPECT_TRUE(Of(g, kGraph).empty());
}

TEST(GraphRanges, CapturedCopiesBelongToTheGraphTheCaptureMade) {
  GraphRanges g;
  g.AddToCapture(7, {0x10000, 0x20000});
  g.AddToCapture(7, {0x11000, 0x12000});  // inside the first: not kept twice
  g.AddToCapture(9, {0x50000, 0x51000});  // another stream's capture
  EXPECT_TRUE(Of(g, kGraph).empty()) << "not a graph's until the capture ends";
  g.EndCapture(7, kGraph);
  EXPECT_EQ(Of(g, kGraph), (std::vector<std::pair<uintptr_t, uintptr_t>>{{0x10000, 0x20000}}));
  g.EndCapture(9, nullptr);  // invalidated: no graph
  g.EndCapture(9, kOther);
  EXPECT_TRUE(Of(g, kOther).empty());
}

TEST(GraphRanges, ExecutableGraphsCarryTheirGraphsRangesAndStraysGoEverywhere) {
  GraphRanges g;
  g.Add(kGraph, {0x10000, 0x20000});
  g.CopyTo(kGraph, kExec);
  g.Forget(kGraph);  // the graph may be destroyed once instantiated
  EXPECT_EQ(Of(g, kExec).size(), 1u);
  g.AddStray({0x90000, 0x91000});
  EXPECT_EQ(Of(g, kExec).size(), 2u);
  EXPECT_EQ(Of(g, kOther).size(), 1u) << "a node of an unknown graph: every launch covers it";
  g.Forget(kExec);
  EXPECT_EQ(Of(g, kExec).size(), 1u);
}

TEST(GraphRanges, ManyRangesMergeIntoOneThatCoversThemAll) {
  GraphRanges g;
  for (size_t i = 0; i <= GraphRanges::kMaxPerOwner; ++i) {
    g.Add(kGraph, {0x100000 + i * 0x2000, 0x100000 + i * 0x2000 + 0x1000});
  }
  const auto ranges = Of(g, kGraph);
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_EQ(ranges[0].first, 0x100000u);
  EXPECT_EQ(ranges[0].second, 0x100000u + GraphRanges::kMaxPerOwner * 0x2000 + 0x1000);
}

}  // namespace
}  // namespace lazypin
