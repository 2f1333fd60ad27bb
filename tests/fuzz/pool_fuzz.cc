// libFuzzer target: the input bytes choose a sequence of pool operations
// (register, unregister, invalidate, context drops, idle collection, ...) on a
// small address space; the harness of tests/unit/driver_model.h checks every
// program-visible result against the driver without lazypin and the pool's
// invariants after every step. The first bytes choose the scenario (driver
// overlap granularity, bounds, pinning capacity, frame checks).
#include <cstdio>
#include <cstdlib>

#include "driver_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lazypin::model;
  ByteSource src(data, size);
  HarnessOptions options;
  options.granularity = src.Next(2) == 0 ? 1 : kPage;
  options.limits.max_entries = 1 + src.Next(8);
  options.limits.max_bytes = (1 + src.Next(8)) * kPage / 2;
  options.capacity = src.Next(4) == 0 ? (2 + src.Next(6)) * kPage : ~uint64_t{0};
  options.limits.check_frames = src.Next(4) == 0;
  options.remaps = options.limits.check_frames;
  options.arena_bytes = (1 + src.Next(6)) * kPage;
  PoolHarness harness(options);
  const std::string error = RunOps(harness, src, 4096, [&] { return src.exhausted(); });
  if (!error.empty()) {
    std::fprintf(stderr, "pool_fuzz: %s\n", error.c_str());
    std::abort();
  }
  return 0;
}
