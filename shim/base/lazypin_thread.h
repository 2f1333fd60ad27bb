// lazypin_thread: lazypin's own threads (the log's writer, the collector,
// the kernel watch's reader and unwatch thread, idle waiters): how they start
// (from spare threads made ahead, or new), the signals they take, and how
// they wait for work.
#pragma once

#include <signal.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <utility>

namespace lazypin {

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

}  // namespace lazypin
