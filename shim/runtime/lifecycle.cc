// lifecycle: set-up once, exit, fork, fatal signals, and the published state
// (see shim.h).
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>

#include <mutex>

#include "covered_signals.h"
#include "fork_fence.h"
#include "lazypin_thread.h"
#include "real.h"
#include "shim.h"
#include "thread_state.h"

namespace lazypin {

const ShimState* g_state = nullptr;
Shim* g_shim = nullptr;  // set once, before Init() publishes the first state

void Publish(const ShimState* state) { __atomic_store_n(&g_state, state, __ATOMIC_RELEASE); }

namespace {

void ExitHandler() {
  if (PublishedState() != nullptr && g_shim != nullptr) g_shim->AtExit();
}
void ForkPrepareHandler() {
  if (g_shim != nullptr) g_shim->BeforeFork();
}
void ForkParentHandler() {
  if (g_shim != nullptr) g_shim->AfterForkInParent();
}
void ForkChildHandler() {
  if (g_shim != nullptr) g_shim->InForkChild();
}
// The real sigaction: lazypin's own calls never reach its hook (hooks_signal.cc).
int RealSigaction(int sig, const struct sigaction* act, struct sigaction* old) {
  using Fn = int (*)(int, const struct sigaction*, struct sigaction*);
  static real::Lazy<Fn> real_sigaction;
  Fn fn = real_sigaction.Get(&real::Next, "sigaction");
  return fn != nullptr ? fn(sig, act, old) : -1;
}

void SignalHandler(int sig) {
  const int saved_errno = errno;
  if (g_shim != nullptr) g_shim->OnSignal(sig);
  errno = saved_errno;
}

}  // namespace

// In a copy of the set-up process that fork's handlers did not reach (or not
// yet): switches it to what a fork's child does. Async-signal-safe.
bool LeftSetUpProcess() {
  if (g_shim == nullptr || !g_shim->InCopiedProcess()) return false;
  g_shim->InForkChild(/*raw_copy=*/true);
  return true;
}

const ShimState* StateInThisProcess() {
  const ShimState* state = PublishedState();
  if (state != nullptr && state->dispatch != nullptr && LeftSetUpProcess()) state = PublishedState();
  return state;
}

void Shim::InstallHandlersOnce() {
  // After the first real call, not at set-up (which may run inside CUDA's
  // own): CUDA registered its exit and fork handlers first, and ours run
  // before them (both run last-registered first), while CUDA is usable; a
  // process that never makes a call keeps its signal dispositions untouched.
  // A fork's child before this is told apart by ProcessIdentity.
  if (handlers_installed_.load(std::memory_order_relaxed) || handlers_installed_.exchange(true)) {
    return;
  }
  for (const std::string& warning : said_at_first_call_) fprintf(stderr, "%s\n", warning.c_str());
  atexit(ExitHandler);
  pthread_atfork(ForkPrepareHandler, ForkParentHandler, ForkChildHandler);
  // The log's last records on a fatal signal; the program still sees (and
  // sets) its own dispositions (covered_signals.h).
  for (int sig : {SIGTERM, SIGINT}) {
    struct sigaction old;
    if (RealSigaction(sig, nullptr, &old) == 0 && !(old.sa_flags & SA_SIGINFO) &&
        old.sa_handler == SIG_DFL) {
      struct sigaction action = {};
      action.sa_handler = SignalHandler;
      sigemptyset(&action.sa_mask);
      action.sa_flags = SA_RESTART;
      if (RealSigaction(sig, &action, nullptr) == 0) g_covered_signals.Cover(sig, old);
    }
  }
}

void Shim::AtExit() {
  // A child's exit: the log, the collector and the pool are its parent's.
  if (in_child_ || LeftSetUpProcess()) return;
  static std::atomic<bool> done{false};
  if (done.exchange(true)) return;
  ScopedInsideLazypin inside;
  // From here on a free of pooled memory invalidates on the freeing thread:
  // the collector stops.
  if (guard_) {
    static const MemoryGuard exit_guard(pool_.get(), nullptr, &LeftSetUpProcess, host_cache_.get(),
                                        /*reuse=*/false, glibc_allocator_);
    Publish(new ShimState{state_->requested, state_->effective, state_->why, dispatch_.get(),
                          &exit_guard});
  }
  if (collector_) collector_->Stop();
  if (pool_ && config_.release_at_exit) pool_->ReleaseAll(EvictReason::kExit);
  if (host_cache_ && config_.release_at_exit) host_cache_->ReleaseAll(EvictReason::kExit);
  const PoolCounters counters = pool_ ? pool_->Counters() : PoolCounters{};
  const HostAllocCounters host_counters = host_cache_ ? host_cache_->Counters() : HostAllocCounters{};
  if (recorder_) {
    const AutoPinCopyStats copies = auto_pin_ ? auto_pin_->CopyStats() : AutoPinCopyStats{};
    recorder_->Finish(counters, pool_ != nullptr, host_cache_ ? &host_counters : nullptr,
                      auto_pin_ ? &copies : nullptr);
  }
  // The pool stays: exit handlers and static destructors that run after this
  // one may still free, unmap or register pooled memory (records are dropped
  // from now on). The driver's teardown releases what is left.
}

void Shim::OnSignal(int sig) {
  // Async-signal-safe only: wait for the writer thread, append a short
  // summary by hand, then die of the signal as the program would have. In a
  // fork's or clone's child, or once dying, only the latter: the log is the
  // parent's (and its writer thread is not in the child).
  if (LeftSetUpProcess()) {  // restored the disposition: the signal now acts as without lazypin
    raise(sig);
    return;
  }
  const ShimState* state = PublishedState();
  if (recorder_ && state != nullptr && state->dispatch != nullptr) {
    recorder_->FinishFromSignal(sig == SIGTERM ? "SIGTERM" : "SIGINT");
  }
  static const ShimState dying{Mode::kOff, Mode::kOff, "a fatal signal", nullptr, nullptr};
  Publish(&dying);
  g_covered_signals.Restore(sig, &RealSigaction);
  raise(sig);
}

void Shim::BeforeFork() {
  // The kernel copies pinned anonymous pages into the child at fork (a page
  // a device may write cannot be shared copy-on-write), so what the program
  // unregistered and the pool keeps pinned would be copied into every child:
  // release it first. Not from a fork inside lazypin's own code on this
  // thread (a signal handler's fork), which may hold the pool's lock.
  if (!pool_ || t_state.inside > 0) return;
  const ShimState* state = PublishedState();
  if (state == nullptr || state->dispatch == nullptr) return;
  ScopedInsideLazypin inside;
  // The kernel watch's part of these releases waits until the fork is made
  // (it would hold the mmap lock that fork needs).
  if (watch_) watch_->HoldUnwatches(true);
  pool_->ReleaseAll(EvictReason::kFork);
  // Pinned blocks the program freed are not copied into the child either.
  if (host_cache_) host_cache_->ReleaseAll(EvictReason::kFork);
}

void Shim::AfterForkInParent() {
  if (watch_) watch_->HoldUnwatches(false);
}

void Shim::InForkChild(bool raw_copy) {
  // The child has one thread and none of ours, and any lock of ours may have
  // been held by another thread when it was made: forget the pool without a
  // driver call or a lock, leave the parent's log alone, pass everything
  // through. Async-signal-safe (a clone's child may come here from a signal).
  in_child_ = true;
  ForkFence::ResetInCopy();  // a clone()'s copy starts in its function, past the hook's Open
  if (pool_) pool_->AbandonAfterFork(raw_copy);
  if (host_cache_) host_cache_->AbandonAfterFork();
  hooks_.alloc_gauge->store(0, std::memory_order_relaxed);  // nothing is served or kept here
  if (watch_) watch_->AbandonAfterFork();
  static const ShimState child{Mode::kOff, Mode::kOff, "a fork's child", nullptr, nullptr};
  Publish(&child);
  // Signals do in the child exactly what they do without lazypin.
  for (int sig : {SIGTERM, SIGINT}) g_covered_signals.Restore(sig, &RealSigaction);
}

namespace {

std::mutex& SetUpMutex() {
  static std::mutex* const mu = new std::mutex;  // never destroyed
  return *mu;
}
void SetUpLocked(const HookSide& hooks) {
  if (PublishedState() != nullptr) return;
  ScopedInsideLazypin inside;
  g_shim = new Shim(hooks);  // never destroyed: hooks may run until the very end
  g_shim->Init();            // publishes the state
}

// Sets lazypin up unless it is; true once it is. False at once when another
// thread is doing it now, rather than wait (the caller may hold the loader's
// lock, which that set-up may need: a library constructor that starts CUDA).
bool TrySetUp(const HookSide& hooks) {
  if (PublishedState() != nullptr) return true;
  std::unique_lock<std::mutex> lock(SetUpMutex(), std::try_to_lock);
  if (!lock.owns_lock()) return false;
  SetUpLocked(hooks);
  return true;
}

}  // namespace

const ShimState* ActiveState(const HookSide& hooks) {
  if (PublishedState() == nullptr) {
    std::lock_guard<std::mutex> lock(SetUpMutex());
    SetUpLocked(hooks);
  }
  return StateInThisProcess();
}

// The threads set-up starts: the log's writer; deferring, also the
// collector, the kernel watch's reader and unwatch thread, and the first
// context's idle waiter.
void SetUpWithCuda(const HookSide& hooks) {
  static std::atomic<bool> done{false};
  if (done.load(std::memory_order_relaxed) || done.exchange(true)) return;
  if (PublishedState() != nullptr) return;  // set up already
  const Mode mode = PeekConfig([](const char* name) { return getenv(name); }, {"LAZYPIN_MODE"}).mode;
  if (mode == Mode::kOff) return;
  PrepareSpareThreads(mode == Mode::kDefer ? 5 : 1);
  if (TrySetUp(hooks)) EndUnusedSpareThreads();
}

bool AutoPinAsked() {
  static const bool asked =
      PeekConfig([](const char* name) { return getenv(name); }, {"LAZYPIN_AUTOPIN"}).autopin;
  return asked;
}

}  // namespace lazypin
