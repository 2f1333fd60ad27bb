// collector: the background thread (see collector.h).
#include "collector.h"

#include <linux/futex.h>
#include <malloc.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>

#include "pool.h"
#include "thread_state.h"

namespace lazypin {
namespace {

int64_t MonotonicMs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1000000;
}

}  // namespace

Collector::Collector(Pool* pool, int64_t idle_ms, FreeFn real_free)
    : pool_(pool), idle_ms_(idle_ms), real_free_(real_free) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);  // the new thread inherits the mask
  thread_ = std::thread([this] { Run(); });
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

bool Collector::TakeFree(void* block) {
  if (stopping_.load(std::memory_order_acquire)) return false;
  auto* node = static_cast<FreedBlock*>(block);
  FreedBlock* head = frees_.load(std::memory_order_relaxed);
  do {
    node->next = head;
  } while (!frees_.compare_exchange_weak(head, node, std::memory_order_release,
                                         std::memory_order_relaxed));
  Wake();
  return true;
}

void Collector::Wake() {
  wake_seq_.fetch_add(1, std::memory_order_release);
  syscall(SYS_futex, &wake_seq_, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
}

void Collector::FinishFrees() {
  FreedBlock* node = frees_.exchange(nullptr, std::memory_order_acquire);
  while (node != nullptr) {
    FreedBlock* next = node->next;
    const uintptr_t lo = reinterpret_cast<uintptr_t>(node);
    pool_->Invalidate(lo, lo + malloc_usable_size(node), EvictReason::kFree);
    real_free_(node);
    node = next;
  }
}

void Collector::Stop() {
  if (stopping_.exchange(true, std::memory_order_acq_rel)) return;
  Wake();
  if (thread_.joinable()) thread_.join();
  ScopedInsideLazypin inside;
  FinishFrees();  // handed over before `stopping_` was seen
}

void Collector::Run() {
  ScopedInsideLazypin inside;  // its frees and the driver's are ours: pass them through
  const int64_t period_ms = std::clamp<int64_t>(idle_ms_ / 4, 10, 1000);
  int64_t next_collect_ms = MonotonicMs() + period_ms;
  while (!stopping_.load(std::memory_order_acquire)) {
    const uint32_t seq = wake_seq_.load(std::memory_order_acquire);
    FinishFrees();
    int64_t wait_ms = 1000;
    if (idle_ms_ > 0) {
      const int64_t now_ms = MonotonicMs();
      if (now_ms >= next_collect_ms) {
        pool_->CollectIdle(idle_ms_ * 1000000);
        next_collect_ms = now_ms + period_ms;
      }
      wait_ms = std::max<int64_t>(next_collect_ms - now_ms, 1);
    }
    if (frees_.load(std::memory_order_relaxed) != nullptr) continue;
    struct timespec timeout = {wait_ms / 1000, (wait_ms % 1000) * 1000000};
    syscall(SYS_futex, &wake_seq_, FUTEX_WAIT_PRIVATE, seq, &timeout, nullptr, 0);
  }
}

}  // namespace lazypin
