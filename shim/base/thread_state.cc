// thread_state: the per-thread state and its queue of frees (see thread_state.h).
#include "thread_state.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>

namespace lazypin {

thread_local ThreadState t_state LAZYPIN_TLS;
__thread bool t_own_thread LAZYPIN_TLS = false;

void FreeQueuedFrees() {
  // A signal handler may queue more meanwhile: take the queue with signals blocked.
  sigset_t all, old;
  sigfillset(&all);
  void* frees[ThreadState::kQueuedFrees];
  int n;
  pthread_sigmask(SIG_BLOCK, &all, &old);
  n = t_state.queued_free_count;
  for (int i = 0; i < n; ++i) frees[i] = t_state.queued_frees[i];
  t_state.queued_free_count = 0;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  for (int i = 0; i < n; ++i) free(frees[i]);  // through the hook: invalidates, then frees
}

}  // namespace lazypin
