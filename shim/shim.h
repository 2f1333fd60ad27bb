// shim: the one object that wires config, log, stats and pool, and owns the
// process lifecycle (first call, exit, fork, SIGTERM/SIGINT). Hooks are thin:
// each calls one entry point here. Nothing is set up before the program's
// first registration call; a program that never calls CUDA pays nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "config.h"
#include "pool.h"
#include "stats.h"
#include "thread_state.h"

#define LAZYPIN_EXPORT extern "C" __attribute__((visibility("default")))

namespace lazypin {

class Log;
class Collector;

// How the program reached a hook.
enum class Via { kSymbol, kDlsym, kGetProc };
const char* ViaName(Via via);

extern Pool* g_active_pool;  // see Shim::ActivePool

class Shim {
 public:
  // The instance, set up on first use; null in a fork's child after setup,
  // when LAZYPIN_MODE=off, or after exit: then hooks pass through.
  static Shim* Active();
  // The instance if already set up, without setting it up (queries, teardown).
  static Shim* IfActive();
  // The pool when deferring (memory hooks only need this); else null. A
  // builtin, not std::atomic: a sanitizer's runtime reaches the free hook
  // before its shadow memory exists (see shim/CMakeLists.txt).
  static Pool* ActivePool() { return __atomic_load_n(&g_active_pool, __ATOMIC_ACQUIRE); }

  // cudaHostRegister / cudaHostUnregister: time and record the call. A pool
  // hit or deferral is taken here; anything else in the driver hook beneath.
  int RuntimeCall(Api api, Via via, void* ptr, size_t bytes, unsigned flags,
                  absl::FunctionRef<int()> real);
  // cuMemHostRegister(_v2) / cuMemHostUnregister, from the program or from cudart.
  int DriverRegister(Api api, Via via, void* ptr, size_t bytes, unsigned flags,
                     absl::FunctionRef<int()> real);
  int DriverUnregister(Api api, Via via, void* ptr, absl::FunctionRef<int()> real);

  // Context teardown and pointer queries (driver level).
  void BeforeContextDestroy(void* ctx);
  void BeforePrimaryContextReset(int device, bool forget_in_use);
  void BeforeQuery(uintptr_t ptr);

  // Memory [lo, hi) is about to leave the process.
  static void MemoryLeaving(uintptr_t lo, uintptr_t hi, EvictReason reason);
  // Async-signal-safe: the collector invalidates, then frees `block` (of
  // `bytes`). False when there is no collector (not deferring, after exit, in
  // a fork's child). With `may_wait`, waits (boundedly) for it once more than
  // kMaxPendingFreeBytes are handed over and not yet freed.
  static bool HandOverFree(void* block, size_t bytes, bool may_wait);
  static constexpr uint64_t kMaxPendingFreeBytes = uint64_t{64} << 20;
  static constexpr int64_t kPendingFreeWaitMs = 2000;

  // Exit, fork and signal handling (public for the C callbacks).
  void AtExit(const char* ended_by);
  void OnSignal(int sig);
  void InForkChild();

  // Log records (also used by the pool observer).
  void RecordEvict(uintptr_t ptr, size_t bytes, EvictReason reason, int result, int64_t latency_ns);
  void Warn(const std::string& message);

 private:
  Shim();
  void Init();
  bool SelfTestMemoryHooks(std::string* why);
  void InstallExitHandlersOnce();
  void WriteHeader();
  int64_t Now() const;
  void Record(Api api, Via via, void* ptr, size_t bytes, unsigned flags, int result,
              int64_t latency_ns, Action action, int evicted);
  // One driver-level call: pooled (defer) or forwarded, timed, recorded
  // unless cudart called it (then the runtime hook records).
  int DriverCall(Api api, Via via, void* ptr, size_t bytes, unsigned flags,
                 absl::FunctionRef<int()> real, absl::FunctionRef<Outcome()> pooled);
  Outcome PoolRegister(void* ptr, size_t bytes, unsigned flags, absl::FunctionRef<int()> real);
  // A register request in context `ctx`, with the device of the current context.
  static RegisterRequest Request(void* ptr, size_t bytes, unsigned flags, void* ctx);

  Config config_;
  std::vector<std::string> config_errors_;
  int64_t start_mono_ns_ = 0;
  int64_t start_unix_ns_ = 0;
  std::unique_ptr<Log> log_;
  Stats stats_;
  std::unique_ptr<PoolDriver> pool_driver_;
  std::unique_ptr<PoolObserver> pool_observer_;
  std::unique_ptr<Pool> pool_;
  std::unique_ptr<Collector> collector_;
};

}  // namespace lazypin
