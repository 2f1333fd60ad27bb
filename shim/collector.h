// collector: the background thread that releases pooled registrations left
// unused for LAZYPIN_IDLE_MS. It never releases more than the program itself
// unregistered (each pooled entry stands for one unregister the program
// asked for and lazypin postponed), so it adds no stall the program would not
// have had; it only moves it to a moment when the memory has been idle.
#pragma once

#include <cstdint>
#include <thread>

#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace lazypin {

class Pool;

class Collector {
 public:
  // Starts the thread (all signals blocked in it).
  Collector(Pool* pool, int64_t idle_ms);
  // Stops and joins it.
  void Stop();

 private:
  void Run();

  Pool* const pool_;
  const int64_t idle_ms_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace lazypin
