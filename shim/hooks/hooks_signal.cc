// hooks_signal: the program's sigaction() and signal() for the signals
// lazypin's own handler covers see and set the program's dispositions
// (base/covered_signals.h); every other call is glibc's.
#include <signal.h>

#include "covered_signals.h"
#include "export.h"
#include "real.h"

namespace lazypin {
namespace {

using SigactionFn = int (*)(int, const struct sigaction*, struct sigaction*);
using SignalFn = sighandler_t (*)(int, sighandler_t);
real::Lazy<SigactionFn> g_sigaction;
real::Lazy<SignalFn> g_signal;
real::Lazy<SignalFn> g_bsd_signal;

int RealSigaction(int sig, const struct sigaction* act, struct sigaction* old) {
  SigactionFn real = g_sigaction.Get(&real::Next, "sigaction");
  return real != nullptr ? real(sig, act, old) : -1;
}

// signal(): glibc's BSD semantics (the signal blocked in its handler,
// interrupted calls restarted), through the covered view.
sighandler_t CoveredSignal(int sig, sighandler_t handler) {
  struct sigaction act = {};
  act.sa_handler = handler;
  sigemptyset(&act.sa_mask);
  sigaddset(&act.sa_mask, sig);
  act.sa_flags = SA_RESTART;
  struct sigaction old = {};
  if (g_covered_signals.ProgramSigaction(sig, &act, &old, &RealSigaction) != 0) return SIG_ERR;
  return old.sa_handler;
}

}  // namespace
}  // namespace lazypin

using namespace lazypin;  // NOLINT: the hooks below are C symbols

LAZYPIN_EXPORT int sigaction(int sig, const struct sigaction* act, struct sigaction* old) {
  if (g_covered_signals.Covers(sig)) return g_covered_signals.ProgramSigaction(sig, act, old, &RealSigaction);
  return RealSigaction(sig, act, old);
}

LAZYPIN_EXPORT sighandler_t signal(int sig, sighandler_t handler) {
  if (g_covered_signals.Covers(sig)) return CoveredSignal(sig, handler);
  SignalFn real = g_signal.Get(&real::Next, "signal");
  return real != nullptr ? real(sig, handler) : SIG_ERR;
}

LAZYPIN_EXPORT sighandler_t bsd_signal(int sig, sighandler_t handler) {
  if (g_covered_signals.Covers(sig)) return CoveredSignal(sig, handler);
  SignalFn real = g_bsd_signal.Get(&real::Next, "bsd_signal");
  return real != nullptr ? real(sig, handler) : SIG_ERR;
}
