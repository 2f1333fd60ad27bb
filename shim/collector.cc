// collector: the idle-release thread (see collector.h).
#include "collector.h"

#include <signal.h>

#include <algorithm>

#include <chrono>

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
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Collector::Run() {
  ScopedInsideLazypin inside;  // its frees and the driver's are ours: pass them through
  const auto period = std::chrono::milliseconds(std::clamp<int64_t>(idle_ms_ / 4, 10, 1000));
  std::unique_lock<std::mutex> lock(mu_);
  while (!wake_.wait_for(lock, period, [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_; })) {
    lock.unlock();
    pool_->CollectIdle(idle_ms_ * 1000000);
    lock.lock();
  }
}

}  // namespace lazypin
