// shim: the one object that wires the layers (configuration, recorder, pool,
// host-allocation cache, collector, dispatch, memory guard, auto-pin) and
// owns the process lifecycle: set-up when CUDA sets up (the driver's getter)
// or in the program's first registration call, exit, fork, SIGTERM/SIGINT.
// It publishes what it set up as the ShimState (state.h) that the hooks
// read; a program call reaches runtime/ only for that state (ActiveState).
//   setup.cc      Init: what runs, from the configuration
//   lifecycle.cc  exit, fork, signals, the published state
#pragma once

#include <signal.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "auto_pin.h"
#include "collector.h"
#include "config.h"
#include "cuda_env.h"
#include "dispatch.h"
#include "host_alloc_cache.h"
#include "mem_watch.h"
#include "memory_budget.h"
#include "memory_guard.h"
#include "memory_limit.h"
#include "pool.h"
#include "process.h"
#include "recorder.h"
#include "state.h"

namespace lazypin {

// Everything lazypin set up in this process. Never destroyed: hooks may run
// until the very end.
class Shim {
 public:
  explicit Shim(const HookSide& hooks) : hooks_(hooks) {}
  void Init();
  void AtExit();
  void OnSignal(int sig);
  void BeforeFork();
  void AfterForkInParent();
  // `raw_copy`: a copy fork()'s handlers did not reach (LeftSetUpProcess).
  void InForkChild(bool raw_copy = false);
  // True in a copy of the process that fork's handlers did not reach.
  // Async-signal-safe.
  bool InCopiedProcess() const { return process_.InCopy(); }
  // After the first call lazypin records: exit, fork and signal handlers, and
  // the set-up's warnings on stderr. Idempotent, cheap.
  void InstallHandlersOnce();

 private:
  std::string HeaderLine(const std::string& log_path);
  // Opens the kernel watch as LAZYPIN_WATCH asks; false when it is required and cannot be had.
  bool OpenWatch();

  const HookSide hooks_;
  Config config_;
  ProcessIdentity process_;
  int64_t start_mono_ns_ = 0;
  int64_t start_unix_ns_ = 0;
  std::string cmdline_;  // /proc/self/cmdline at set-up, for the log's header
  std::unique_ptr<Recorder> recorder_;
  std::unique_ptr<CudaEnv> env_;  // dispatch's CUDA (its records go to recorder_)
  std::unique_ptr<MemWatch> watch_;
  std::string watch_reason_;  // why the kernel watch is not on
  std::unique_ptr<PoolDriver> pool_driver_;
  std::unique_ptr<Pool> pool_;
  std::unique_ptr<HostAllocDriver> host_driver_;
  std::unique_ptr<HostAllocCache> host_cache_;  // defer mode with LAZYPIN_HOST_ALLOC_CACHE > 0
  std::unique_ptr<MemoryProbe> probe_;    // defer mode: the headroom, for budget_
  std::unique_ptr<MemoryBudget> budget_;  // defer mode: kept memory yields to the program
  std::unique_ptr<Collector> collector_;
  std::unique_ptr<Dispatch> dispatch_;
  std::unique_ptr<MemoryGuard> guard_;
  bool glibc_allocator_ = false;  // AllocatorReuseCheck passed (defer mode)
  std::unique_ptr<AutoPin> auto_pin_;
  Mode effective_ = Mode::kOff;
  std::string why_;  // why the effective mode differs from the requested one
  std::vector<std::string> warnings_;  // set-up's, for the log's first lines; fixed after Init
  // Those of warnings_ that stderr gets with the first call lazypin records
  // (InstallHandlersOnce), not at set-up: a CUDA program that never makes one
  // hears nothing of what lazypin would have done (configuration errors are
  // said at once).
  std::vector<std::string> said_at_first_call_;
  const ShimState* state_ = nullptr;
  std::atomic<bool> handlers_installed_{false};
  bool in_child_ = false;  // InForkChild ran: nothing here is this process's
};

// The one Shim (null before set-up); lifecycle.cc's handlers find it here.
extern Shim* g_shim;
// Publishes `state` for the hooks.
void Publish(const ShimState* state);
// In a copy of the set-up process: switches it to pass-through (as a fork's
// child) and returns true. Async-signal-safe.
bool LeftSetUpProcess();

}  // namespace lazypin
