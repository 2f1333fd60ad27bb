// thread_state: what lazypin keeps per thread. `inside` > 0 while the thread
// runs lazypin's own code (or a real function called from it): hooks entered
// then pass straight through, so no lock of lazypin's is taken twice and
// nothing recurses. Frees of pooled memory that arrive meanwhile (a signal
// handler that interrupted lazypin) wait in a small queue until it returns.
#pragma once

#include <signal.h>

#include <atomic>
#include <functional>
#include <thread>
#include <utility>

#define LAZYPIN_TLS __attribute__((tls_model("initial-exec")))

namespace lazypin {

struct ThreadState {
  int inside = 0;
  static constexpr int kQueuedFrees = 16;
  void* queued_frees[kQueuedFrees] = {};
  int queued_free_count = 0;
  struct RuntimeFrame* runtime_frame = nullptr;  // see dispatch.h
};
extern thread_local ThreadState t_state LAZYPIN_TLS;
// One of lazypin's own threads (StartLazypinThread). A plain bool
// __thread, of its own: read on the allocator hooks' fast path, with no TLS
// wrapper call (a C++ thread_local may need a dynamic initializer).
extern __thread bool t_own_thread LAZYPIN_TLS;

// Frees what was queued while `inside`, through the global free (lazypin's
// hook in the shim), with signals blocked while it takes the queue.
void FreeQueuedFrees();

// Signals and lazypin's threads: while one of them works, every signal is
// blocked. While it waits for work (IdleWait, IdleSignals), it accepts the
// signals the program's thread that started it accepted, as a thread the
// program made then would: a signal the program sends to each of its
// threads (a census through /proc/self/task, a collector's stop-the-world)
// is taken, and the program's handler runs there, at a point where the
// thread holds no lock of lazypin's. The kernel watch's reader is the one
// exception (mem_watch.cc): it blocks every signal, always.
// FutexWait(word, seen, timeout_ns), accepting those signals meanwhile.
void IdleWait(const void* word, uint32_t seen, int64_t timeout_ns = -1);
// The mask to wait under (for ppoll): the starting thread's; on a thread
// that is not lazypin's, or before one was recorded, every signal blocked.
const sigset_t* IdleSignals();

// One of lazypin's own threads (log writer, collector, kernel watch reader,
// idle waiter), as std::thread is used: joinable(), join(), detach(). It is
// either a thread started for it, or a spare thread started earlier
// (PrepareSpareThreads) that was waiting for a body to run.
class LazypinThread {
 public:
  LazypinThread() = default;
  LazypinThread(LazypinThread&& other) noexcept { *this = std::move(other); }
  LazypinThread& operator=(LazypinThread&& other) noexcept {
    thread_ = std::move(other.thread_);
    job_ = other.job_;
    other.job_ = nullptr;
    return *this;
  }
  bool joinable() const { return thread_.joinable() || job_ != nullptr; }
  void join();
  void detach();

  // A body that a spare thread runs: `done` (a futex) is 1 once it returned.
  struct Job {
    std::function<void()> body;
    std::atomic<uint32_t> done{0};
    std::atomic<bool> detached{false};  // the spare frees the job when both are set
  };

 private:
  friend LazypinThread StartLazypinThread(std::function<void()> body);
  std::thread thread_;
  Job* job_ = nullptr;
};

// Starts lazypin's own threads: every signal blocked in them, so that they
// never run the program's handlers. Takes a spare thread of this process if
// one is waiting (no thread is created on the caller's path then), else
// starts one (std::thread: throws std::system_error when it cannot).
LazypinThread StartLazypinThread(std::function<void()> body);
template <typename Fn>
LazypinThread StartThreadWithSignalsBlocked(Fn&& body) {
  return StartLazypinThread(std::function<void()>(std::forward<Fn>(body)));
}

// Starts up to `count` spare threads in this process (once; later calls do
// nothing), waiting, with every signal blocked, for StartLazypinThread to
// hand them a body. Called just before lazypin's set-up inside CUDA's own
// (cudart asking the driver for its entry points), which then starts none of
// its own. A fork's child has none (they are the parent's).
void PrepareSpareThreads(int count);
// Ends the spare threads that no body was handed (set-up needed fewer: the
// kernel watch unavailable, defer mode turned off).
void EndUnusedSpareThreads();

class ScopedInsideLazypin {
 public:
  ScopedInsideLazypin() { ++t_state.inside; }
  ~ScopedInsideLazypin() {
    if (--t_state.inside == 0 && t_state.queued_free_count != 0) FreeQueuedFrees();
  }
  ScopedInsideLazypin(const ScopedInsideLazypin&) = delete;
  ScopedInsideLazypin& operator=(const ScopedInsideLazypin&) = delete;
};

}  // namespace lazypin
