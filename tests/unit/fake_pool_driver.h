// fake_pool_driver: a PoolDriver over the driver model (driver_model.h) that
// logs every call in order, and a PoolObserver that keeps what it is told:
// for tests of the pool and of what drives it (pool_test, memory_guard_test).
#pragma once

#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "driver_model.h"
#include "pool.h"

namespace lazypin {

inline std::string Hex(uintptr_t p) { return absl::StrFormat("0x%x", p); }

class FakePoolDriver final : public PoolDriver {
 public:
  int Unregister(uintptr_t ptr, Context ctx, ReleaseWait* wait) override {
    log.push_back("evict " + Hex(ptr));
    eviction_ctx.push_back(ctx);
    after_wait.push_back(wait->after_wait);
    return model.Unregister(ptr);
  }
  bool ReadFrames(uintptr_t ptr, size_t bytes, std::vector<uint64_t>* frames) override {
    reads += 1;
    if (!frames_known) return false;
    *frames = {frame_base + ptr / model::kPage};
    return true;
  }
  int64_t NowNs() override { return now; }

  model::DriverModel model;
  std::vector<std::string> log;
  std::vector<Context> eviction_ctx;
  std::vector<bool> after_wait;  // ReleaseWait::after_wait of each eviction
  int64_t now = 0;
  uint64_t frame_base = 0;
  bool frames_known = true;
  int reads = 0;
};

class FakePoolObserver final : public PoolObserver {
 public:
  void OnEvict(uintptr_t ptr, size_t bytes, EvictReason reason, int result, int64_t,
               const ReleaseWait&) override {
    evicts.push_back(absl::StrFormat("%s %s %d", EvictReasonName(reason), Hex(ptr), result));
  }
  void OnWarning(const std::string& message) override { warnings.push_back(message); }
  std::vector<std::string> evicts;
  std::vector<std::string> warnings;
};

}  // namespace lazypin
