// covered_signals: the signals lazypin's own handler covers (SIGINT and
// SIGTERM, whose handler writes the log's last records, then lets the signal
// act as it would have), with the disposition the program believes it has.
//
// Contract (as a sanitizer's interceptors keep it): while lazypin's handler
// is installed for a signal, the program's sigaction() and signal() for it
// see the disposition the program set, never lazypin's (hooks_signal.cc).
// Setting SIG_DFL keeps lazypin's handler, which then ends the log and acts
// as the default; setting a handler of the program's or SIG_IGN installs it
// for real, and lazypin steps aside for that signal for good. The program
// thus runs under exactly the dispositions it asked for.
#pragma once

#include <pthread.h>
#include <signal.h>

#include <atomic>

namespace lazypin {

class CoveredSignals {
 public:
  using RealSigaction = int (*)(int, const struct sigaction*, struct sigaction*);

  // Cheap: lazypin's handler is installed for `sig`.
  bool Covers(int sig) const {
    return sig > 0 && sig < kMax && covered_[sig].load(std::memory_order_acquire);
  }
  // After lazypin installed its handler for `sig`: `program` is what was
  // there before (the program's view from now on).
  void Cover(int sig, const struct sigaction& program) {
    if (sig <= 0 || sig >= kMax) return;
    program_[sig] = program;
    covered_[sig].store(true, std::memory_order_release);
  }
  // The program's view of a covered signal (async-signal-safe).
  const struct sigaction& Program(int sig) const { return program_[sig]; }
  // Lazypin's handler goes (a fork's child, a fatal signal): the program's
  // view is installed for real through `real`.
  void Restore(int sig, RealSigaction real) {
    if (!Covers(sig)) return;
    covered_[sig].store(false, std::memory_order_release);
    real(sig, &program_[sig], nullptr);
  }
  // The program's sigaction(sig, act, old) for a covered signal; returns
  // what sigaction returns.
  int ProgramSigaction(int sig, const struct sigaction* act, struct sigaction* old,
                       RealSigaction real) {
    // Signals blocked while the view changes: lazypin's handler reads it.
    sigset_t all, mask;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &mask);
    if (old != nullptr) *old = program_[sig];
    int rc = 0;
    if (act != nullptr) {
      if (!(act->sa_flags & SA_SIGINFO) && act->sa_handler == SIG_DFL) {
        program_[sig] = *act;
      } else {
        rc = real(sig, act, nullptr);
        if (rc == 0) covered_[sig].store(false, std::memory_order_release);
      }
    }
    pthread_sigmask(SIG_SETMASK, &mask, nullptr);
    return rc;
  }

 private:
  static constexpr int kMax = 65;
  std::atomic<bool> covered_[kMax] = {};
  struct sigaction program_[kMax] = {};
};

// The process's one table (zero-initialized: usable before any constructor).
inline CoveredSignals g_covered_signals;

}  // namespace lazypin
