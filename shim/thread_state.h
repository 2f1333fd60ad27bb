// thread_state: what lazypin keeps per thread. `inside` > 0 while the thread
// runs lazypin's own code (or a real function called from it): hooks entered
// then pass straight through, so no lock of lazypin's is taken twice and
// nothing recurses. Frees of pooled memory that arrive meanwhile (a signal
// handler that interrupted lazypin) wait in a small queue until it returns.
#pragma once

#include <signal.h>

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
  bool own_thread = false;  // one of lazypin's own threads (StartThreadWithSignalsBlocked)
};
extern thread_local ThreadState t_state LAZYPIN_TLS;

// Frees what was queued while `inside`, through the global free (lazypin's
// hook in the shim), with signals blocked while it takes the queue.
void FreeQueuedFrees();

// Starts lazypin's own threads (log flusher, collector): every signal blocked
// in them, so that they never run the program's handlers.
template <typename Fn>
std::thread StartThreadWithSignalsBlocked(Fn&& body) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);  // the new thread inherits the mask
  std::thread thread([body = std::forward<Fn>(body)]() mutable {
    t_state.own_thread = true;
    body();
  });
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return thread;
}

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
