// LogRing (shim/telemetry/log_ring.h): the bounded many-producer,
// one-consumer queue between the threads that record calls and the log's
// writer. Every record pushed is popped once, in each producer's order; a
// full ring refuses the push and keeps what it holds.
#include "log_ring.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace lazypin {
namespace {

LogEntry Entry(int32_t tid, uint64_t seq) {
  LogEntry entry;
  entry.kind = LogEntry::Kind::kCall;
  entry.tid = tid;
  entry.bytes = seq;
  return entry;
}

TEST(LogRingTest, PopsInOrderAndRefusesWhenFull) {
  LogRing ring;
  ASSERT_TRUE(ring.ok());
  LogEntry out;
  EXPECT_FALSE(ring.Pop(&out));
  for (uint64_t i = 0; i < LogRing::kSlots; ++i) ASSERT_EQ(ring.TryPush(Entry(1, i)), i + 1);
  EXPECT_EQ(ring.TryPush(Entry(1, 999999)), 0u);  // full: refused, nothing overwritten
  for (uint64_t i = 0; i < LogRing::kSlots; ++i) {
    ASSERT_TRUE(ring.Pop(&out));
    ASSERT_EQ(out.bytes, i);
  }
  EXPECT_FALSE(ring.Pop(&out));
  EXPECT_EQ(ring.pushed(), ring.popped());
  // Laps: the slots are reused with their sequence numbers.
  for (uint64_t lap = 0; lap < 3 * LogRing::kSlots; ++lap) {
    ASSERT_NE(ring.TryPush(Entry(2, lap)), 0u);
    ASSERT_TRUE(ring.Pop(&out));
    ASSERT_EQ(out.bytes, lap);
    ASSERT_EQ(out.tid, 2);
  }
}

TEST(LogRingTest, ManyProducersOneConsumerLoseNothing) {
  LogRing ring;
  constexpr int kProducers = 4;
  constexpr uint64_t kEach = 100000;
  std::atomic<int> running{kProducers};
  std::vector<std::thread> producers;
  for (int t = 0; t < kProducers; ++t) {
    producers.emplace_back([&, t] {
      for (uint64_t i = 0; i < kEach; ++i) {
        while (ring.TryPush(Entry(t, i)) == 0) std::this_thread::yield();  // full: retry
      }
      running.fetch_sub(1);
    });
  }
  std::vector<uint64_t> next(kProducers, 0);
  uint64_t popped = 0;
  LogEntry out;
  while (popped < kProducers * kEach) {
    if (!ring.Pop(&out)) {
      std::this_thread::yield();
      continue;
    }
    ASSERT_GE(out.tid, 0);
    ASSERT_LT(out.tid, kProducers);
    ASSERT_EQ(out.bytes, next[out.tid]) << "producer " << out.tid << " out of order";
    ++next[out.tid];
    ++popped;
  }
  for (auto& producer : producers) producer.join();
  EXPECT_EQ(running.load(), 0);
  EXPECT_FALSE(ring.Pop(&out));
  EXPECT_EQ(ring.pushed(), kProducers * kEach);
}

}  // namespace
}  // namespace lazypin
