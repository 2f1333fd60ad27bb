// dispatch: the path of one program register or unregister, whichever door it
// came through, from the hook to the pool or the driver and back, timed and
// recorded once. The clock, the current context and the record sink are
// injected (DispatchEnv), the driver is the `real` callable of each call, and
// the pool is optional (null: log mode), so all of it runs in a unit test with
// no hooks and no CUDA.
//
// A runtime call (cudaHostRegister) usually reaches the driver hook beneath it
// through cudart. The runtime hook owns the call: it opens a RuntimeFrame on
// its stack; a driver call made on the same thread while the frame is open is
// cudart's, so it acts (pool or driver) and reports its outcome into the frame
// instead of recording. cudart lies between the two hooks, so the frame is
// found through the thread's state; it is the only thing carried that way.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "pool.h"
#include "types.h"

namespace lazypin {

// One program call as the hook saw it. `bytes` and `flags` are 0 for unregisters.
struct ProgramCall {
  Api api;
  Via via;
  void* ptr;
  size_t bytes;
  unsigned flags;
};

// What a call came to, for the log and the statistics.
struct CallRecord {
  ProgramCall call;
  int result;
  int64_t latency_ns;
  Action action;
  int evicted;
};

class DispatchEnv {
 public:
  virtual ~DispatchEnv() = default;
  virtual int64_t NowNs() = 0;
  // The calling thread's current CUDA context (null: none) and its device (-1: none).
  virtual Context CurrentContext() = 0;
  virtual int CurrentDevice() = 0;
  // The driver would refuse an unregister on the calling thread now (900: a
  // stream capture in progress forbids it, which the refusal invalidates).
  // Such an unregister is forwarded, not deferred, so that the program sees
  // the driver's answer. Cheap when nothing captures.
  virtual bool CaptureForbidsDeferral() = 0;
  // Exactly once per program call, after it returned from the driver or the pool.
  virtual void Record(const CallRecord& record) = 0;
};

// Open while a runtime call is in cudart: the driver calls cudart makes on
// its behalf fill it in.
struct RuntimeFrame {
  Outcome outcome;
  int driver_calls = 0;
};

class Dispatch {
 public:
  // `pool` null: log mode (every call forwarded, timed and recorded).
  Dispatch(DispatchEnv* env, Pool* pool) : env_(env), pool_(pool) {}
  Dispatch(const Dispatch&) = delete;
  Dispatch& operator=(const Dispatch&) = delete;

  // cudaHostRegister / cudaHostUnregister. A pool hit or deferral is taken here
  // without calling cudart; otherwise `real` calls cudart, which reaches the
  // driver (Driver() below, on this thread) any number of times, and cudart's
  // own answer is returned.
  int Runtime(const ProgramCall& call, absl::FunctionRef<int()> real);
  // cuMemHostRegister(_v2) / cuMemHostUnregister: from the program, or from
  // cudart inside a Runtime() call of this thread.
  int Driver(const ProgramCall& call, absl::FunctionRef<int()> real);

  // Driver calls that change what the pool may hold.
  void BeforeContextDestroy(Context ctx);
  void BeforePrimaryContextReset(int device, bool forget_in_use);
  // A pointer query: memory the program unregistered must look unregistered.
  void BeforeQuery(uintptr_t ptr);

  Pool* pool() const { return pool_; }

 private:
  Outcome Act(const ProgramCall& call, absl::FunctionRef<int()> real);
  RegisterRequest Request(const ProgramCall& call, Context ctx);
  void Record(const ProgramCall& call, const Outcome& outcome, int64_t latency_ns);

  DispatchEnv* const env_;
  Pool* const pool_;
};

}  // namespace lazypin
