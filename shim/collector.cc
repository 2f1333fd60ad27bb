// collector: the idle-release thread (see collector.h).
#include "collector.h"

#include <signal.h>

#include <algorithm>

#include "absl/time/time.h"
#include "pool.h"
#include "shim.h"

namespace lazypin {

Collector::Collector(Pool* pool, int64_t idle_ms) : pool_(pool), idle_ms_(idle_ms) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);  // the new thread inherits the mask
  thread_ = std::thread([this] { Run(); });
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

void Collector::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void Collector::Run() {
  ScopedInsideLazypin inside;  // its frees and the driver's are ours: pass them through
  const absl::Duration period = absl::Milliseconds(std::clamp<int64_t>(idle_ms_ / 4, 10, 1000));
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stop_), period)) {
    mu_.Unlock();
    pool_->CollectIdle(idle_ms_ * 1000000);
    mu_.Lock();
  }
}

}  // namespace lazypin
