// lazypin_thread: lazypin's own threads (see lazypin_thread.h).
#include "lazypin_thread.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <climits>

#include "absl/functional/function_ref.h"
#include "sys.h"
#include "thread_state.h"

namespace lazypin {

namespace {

// The mask a lazypin thread waits under (IdleSignals).
struct IdleMask {
  bool set = false;
  sigset_t mask;
};
thread_local IdleMask t_idle_mask LAZYPIN_TLS;

sigset_t AllSignals() {
  sigset_t all;
  sigfillset(&all);
  return all;
}

// glibc maps a thread an allocator arena of its own (64 MiB of address
// space) on its first malloc or free, in lazypin's code or in the driver's.
// Made as the thread starts, it is mapped within the program's call that
// started the thread, never later behind its back (after the program lowered
// RLIMIT_AS to what it saw mapped). Under a limit that leaves no room the
// arena is not made and glibc serves the thread from another.
void MakeAllocatorArena() {
  void* p = malloc(1);
  asm volatile("" : : "r"(p) : "memory");  // kept: the pair is not elided
  free(p);
}

}  // namespace

const sigset_t* IdleSignals() {
  static const sigset_t all = AllSignals();
  return t_idle_mask.set ? &t_idle_mask.mask : &all;
}

void IdleWait(const void* word, uint32_t seen, int64_t timeout_ns) {
  if (!t_idle_mask.set) return FutexWait(word, seen, timeout_ns);
  sigset_t working;
  pthread_sigmask(SIG_SETMASK, &t_idle_mask.mask, &working);
  FutexWait(word, seen, timeout_ns);
  pthread_sigmask(SIG_SETMASK, &working, nullptr);
}

namespace {

// The spare threads: each waits on its slot's state for a job.
constexpr int kMaxSpares = 5;
// kIdle from its thread's creation (it may not run yet: the set-up claims
// spares right after starting them); the thread waits for kGiven.
enum SlotState : uint32_t { kEmpty, kIdle, kClaimed, kGiven };
struct SpareSlot {
  std::atomic<uint32_t> state{kEmpty};  // futex
  LazypinThread::Job* job = nullptr;    // set before kGiven
  sigset_t starter_mask;                // its starting thread's signal mask
};
SpareSlot g_spares[kMaxSpares];
std::atomic<pid_t> g_spares_pid{0};  // the process whose threads these are
std::atomic<bool> g_spares_prepared{false};

// This process's spares (a fork's child has none: they are the parent's).
bool HaveSpares() {
  return g_spares_prepared.load(std::memory_order_acquire) &&
         g_spares_pid.load(std::memory_order_acquire) == getpid();
}

// Hands the job `make` returns to an idle spare and returns it; null (and
// `make` not called) when none is idle.
LazypinThread::Job* GiveToIdleSpare(absl::FunctionRef<LazypinThread::Job*()> make) {
  for (SpareSlot& slot : g_spares) {
    uint32_t idle = kIdle;
    if (!slot.state.compare_exchange_strong(idle, kClaimed, std::memory_order_acq_rel)) continue;
    LazypinThread::Job* job = make();
    slot.job = job;
    slot.state.store(kGiven, std::memory_order_release);
    FutexWake(&slot.state, INT_MAX);
    return job;
  }
  return nullptr;
}

void* SpareMain(void* arg) {
  auto* slot = static_cast<SpareSlot*>(arg);
  t_idle_mask.mask = slot->starter_mask;
  t_idle_mask.set = true;
  for (;;) {
    const uint32_t state = slot->state.load(std::memory_order_acquire);
    if (state == kGiven) break;
    IdleWait(&slot->state, state);
  }
  LazypinThread::Job* job = slot->job;
  job->body();
  job->done.store(1, std::memory_order_release);
  FutexWake(&job->done, INT_MAX);
  if (job->detached.exchange(true, std::memory_order_acq_rel)) delete job;
  return nullptr;
}

void StartSignalsBlocked(void* (*main)(void*), SpareSlot* arg, bool* ok) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);  // the new thread inherits the mask
  arg->starter_mask = old;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t thread;
  *ok = pthread_create(&thread, &attr, main, arg) == 0;
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

}  // namespace

void PrepareSpareThreads(int count) {
  if (count <= 0 || g_spares_prepared.exchange(true, std::memory_order_acq_rel)) return;
  g_spares_pid.store(getpid(), std::memory_order_release);
  for (int i = 0; i < count && i < kMaxSpares; ++i) {
    bool ok = false;
    StartSignalsBlocked(&SpareMain, &g_spares[i], &ok);
    if (!ok) break;
    g_spares[i].state.store(kIdle, std::memory_order_release);
  }
}

void EndUnusedSpareThreads() {
  if (!HaveSpares()) return;
  const auto nothing = [] {
    auto* job = new LazypinThread::Job;
    job->body = [] {};
    job->detached.store(true, std::memory_order_relaxed);  // nobody joins: the spare frees it
    return job;
  };
  while (GiveToIdleSpare(nothing) != nullptr) {
  }
}

LazypinThread StartLazypinThread(std::function<void()> fn) {
  sigset_t starter;
  pthread_sigmask(SIG_SETMASK, nullptr, &starter);
  std::function<void()> body = [fn = std::move(fn), starter] {
    MakeAllocatorArena();
    t_own_thread = true;
    t_idle_mask.mask = starter;
    t_idle_mask.set = true;
    fn();
  };
  LazypinThread out;
  if (HaveSpares()) {
    out.job_ = GiveToIdleSpare([&] {
      auto* job = new LazypinThread::Job;
      job->body = std::move(body);
      return job;
    });
    if (out.job_ != nullptr) return out;
  }
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);  // the new thread inherits the mask
  try {
    out.thread_ = std::thread(std::move(body));
  } catch (...) {
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    throw;
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return out;
}

void LazypinThread::join() {
  if (thread_.joinable()) thread_.join();
  if (job_ == nullptr) return;
  while (job_->done.load(std::memory_order_acquire) == 0) FutexWait(&job_->done, 0);
  detach();
}

void LazypinThread::detach() {
  if (thread_.joinable()) thread_.detach();
  if (job_ == nullptr) return;
  if (job_->detached.exchange(true, std::memory_order_acq_rel)) delete job_;
  job_ = nullptr;
}

}  // namespace lazypin
