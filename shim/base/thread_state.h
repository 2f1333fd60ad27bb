// thread_state: what lazypin keeps per thread. `inside` > 0 while the thread
// runs lazypin's own code (or a real function called from it): hooks entered
// then pass straight through, so no lock of lazypin's is taken twice and
// nothing recurses. Frees of pooled memory that arrive meanwhile (a signal
// handler that interrupted lazypin) wait in a small queue until it returns.
#pragma once


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
// One of lazypin's own threads (StartLazypinThread, lazypin_thread.h). A plain bool
// __thread, of its own: read on the allocator hooks' fast path, with no TLS
// wrapper call (a C++ thread_local may need a dynamic initializer).
extern __thread bool t_own_thread LAZYPIN_TLS;

// Frees what was queued while `inside`, through the global free (lazypin's
// hook in the shim), with signals blocked while it takes the queue.
void FreeQueuedFrees();

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
