// dispatch: the path of one program register or unregister, whichever door it
// came through, from the hook to the pool or the driver and back, timed and
// recorded once. The clock and the current context are injected (DispatchEnv,
// the CUDA port), the records' destination too (CallSink, the recorder), the
// driver is the `real` callable of each call, and
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
#include "thread_state.h"
#include "types.h"

namespace lazypin {

class HostAllocCache;

// Where a program call came from, as the hooked function the program called
// saw it (LAZYPIN_CALLER in that function, never in a helper beneath it):
// `pc` its return address, `frame` its frame address, a fixed distance from
// the caller's stack pointer at the call. Both 0: not known. The call-site
// cache keys a stack by them (Recorder::StackOf).
struct Caller {
  uintptr_t pc = 0;
  uintptr_t frame = 0;
};
#define LAZYPIN_CALLER()                                                      \
  ::lazypin::Caller{reinterpret_cast<uintptr_t>(__builtin_return_address(0)), \
                    reinterpret_cast<uintptr_t>(__builtin_frame_address(0))}

// One program call as the hook saw it. `bytes` and `flags` are 0 for
// unregisters and frees; for a host allocation, `ptr` is the block returned
// (null until then, and when it failed).
struct ProgramCall {
  Api api;
  Via via;
  void* ptr;
  size_t bytes;
  unsigned flags;
  Caller caller = {};
};

// What a call came to, for the log and the statistics.
struct CallRecord {
  ProgramCall call;
  int result;
  int64_t latency_ns;
  Action action;
  int evicted;
  PassReason reason;  // with kPassthrough: why
  int64_t end_ns = 0;  // DispatchEnv::NowNs() when the call returned (the second of its two clock reads)
  int device = -1;     // the current context's device, logged with several devices (-1: not logged)
};

class DispatchEnv {
 public:
  virtual ~DispatchEnv() = default;
  virtual int64_t NowNs() = 0;
  // The calling thread's current CUDA context (null: none).
  virtual Context CurrentContext() = 0;
  // The device of `ctx`, the current context (-1: null); with one device, 0
  // without asking the driver.
  virtual int DeviceOf(Context ctx) = 0;
  // The driver would refuse an unregister on the calling thread now (900: a
  // stream capture in progress forbids it, which the refusal invalidates).
  // Such an unregister is forwarded, not deferred, so that the program sees
  // the driver's answer. Cheap when nothing captures.
  virtual bool CaptureForbidsDeferral() = 0;
  // Waits, on the calling thread, for the work in flight in `ctx` (the
  // calling thread's current context) and returns the driver's result. This
  // is the only place lazypin synchronizes the device on the program's
  // behalf (cuCtxSynchronize), so that whatever must not be synchronized
  // (a stream capture in progress: a synchronize invalidates it) is decided
  // in this one function.
  virtual int WaitForDevice(Context ctx) = 0;
  // Whether `device`'s primary context is active (retained) now; false when unknown.
  virtual bool PrimaryContextActive(int device) = 0;
  // `device`'s primary context while it is active, learned without changing
  // its state; null when it is not active or cannot be told.
  virtual Context ActivePrimaryContext(int device) { return nullptr; }
  // The device a call record names (CallRecord::device): the current
  // context's where the driver reports several devices, else -1 (not logged).
  virtual int RecordedDevice() { return -1; }
  // Waits for the work queued on `stream` (a copy just submitted to it),
  // unless the stream is being captured.
  virtual void SynchronizeStream(void* stream) = 0;
  // Whether `stream` has no work in flight (cuStreamQuery: 0), nor work it
  // would wait for (the legacy default stream's, unless it is non-blocking;
  // the null stream counts as legacy, the conservative choice). Asked only
  // where no capture is in progress anywhere (a query could invalidate one);
  // false when unknown.
  virtual bool StreamIdle(void* stream) { return false; }
};

// Where dispatch's records go (the recorder).
class CallSink {
 public:
  virtual ~CallSink() = default;
  // Exactly once per program call: CallStarts before anything else, Record
  // after it returned from the driver or the pool (calls of one thread nest).
  // The call reads the clock twice (DispatchEnv::NowNs: when it began, and
  // record.end_ns); Record should read it no more.
  virtual void CallStarts(const ProgramCall& call) {}
  virtual void Record(const CallRecord& record) = 0;
};

// Open while a runtime call is in cudart: the driver calls cudart makes on
// its behalf fill it in.
struct RuntimeFrame {
  Outcome outcome;
  int driver_calls = 0;
  Api api = Api::kCount;  // the runtime call's API, where the driver hook needs it
  // An unregister: the runtime hook already waited (kWaited: cudart's driver
  // call need not wait again) or the wait failed (kNoDefer: forward it).
  enum class Wait { kNotYet, kWaited, kNoDefer } wait = Wait::kNotYet;
};

// The runtime call's frame is this thread's open frame for the scope: the
// driver calls cudart makes meanwhile report into it.
class ScopedRuntimeFrame {
 public:
  explicit ScopedRuntimeFrame(RuntimeFrame* frame) : outer_(t_state.runtime_frame) {
    t_state.runtime_frame = frame;
  }
  ~ScopedRuntimeFrame() { t_state.runtime_frame = outer_; }
  ScopedRuntimeFrame(const ScopedRuntimeFrame&) = delete;
  ScopedRuntimeFrame& operator=(const ScopedRuntimeFrame&) = delete;

 private:
  RuntimeFrame* const outer_;
};

class Dispatch {
 public:
  // `pool` null: log mode (every call forwarded, timed and recorded).
  // `unregister_wait` (LAZYPIN_UNREGISTER_WAIT): a deferred unregister first
  // waits for the work in flight in the current context, as the driver's
  // unregister does; when that wait fails the unregister is forwarded.
  // `host_cache` null: pinned host allocations and frees are forwarded
  // (timed and recorded); else freed blocks are kept for reuse (the wait
  // before keeping one follows `unregister_wait`, as for an unregister).
  Dispatch(DispatchEnv* env, CallSink* sink, Pool* pool, bool unregister_wait = true,
           HostAllocCache* host_cache = nullptr)
      : env_(env), sink_(sink), pool_(pool), unregister_wait_(unregister_wait),
        host_cache_(host_cache) {}
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

  // Pinned host allocations and frees (dispatch_host_alloc.cc), in the same
  // two halves: cudaHostAlloc / cudaMallocHost / cudaFreeHost open a frame
  // and call cudart (`real`); cudart's cuMemHostAlloc / cuMemAllocHost(_v2) /
  // cuMemFreeHost reach HostDriver on this thread, which decides (cache hit,
  // keep, or the driver) and reports into the frame. One record per program
  // call. `out` is the allocation's result pointer (null for a free).
  int HostRuntime(const ProgramCall& call, void** out, absl::FunctionRef<int()> real);
  int HostDriver(const ProgramCall& call, void** out, absl::FunctionRef<int()> real);

  // Driver calls that change what the pool may hold.
  void BeforeContextDestroy(Context ctx);
  // Before a reset (`forget_in_use`) or release of `device`'s primary
  // context: what the pool and the cache hold in that context goes (only
  // that context's: other contexts on the device, and other devices, keep
  // theirs; where the primary context cannot be told, the device's).
  // Returns the primary context (null: not told), for the release's After.
  Context BeforePrimaryContextReset(int device, bool forget_in_use);
  // After a successful cuDevicePrimaryCtxRelease: if that released the last
  // reference, the driver dropped the context's registrations, in use too.
  void AfterPrimaryContextRelease(int device, Context primary);
  // A pointer query about `ptr`: the address the driver is to be asked about
  // instead. Memory the program unregistered must look unregistered: where
  // the pool keeps a registration of it, an address of lazypin's own that
  // nobody registers (the driver answers as for any unregistered memory, and
  // the registration stays for the program's next register); else `ptr`,
  // once a kept host block there was freed (as the program freed it).
  uintptr_t QueryAddress(uintptr_t ptr);
  // An async copy touching host memory [lo, hi) was just queued on `stream`:
  // if the program unregistered that memory (a deferred entry), it is
  // pageable to the program, and a pageable copy has completed (or staged
  // its source) when the call returns, so the stream is synchronized. The
  // 1D host-to-device forms stage their source instead (CopiesFromDeferred),
  // and reach this only where staging failed.
  // Inline: nothing deferred costs one relaxed load.
  void AfterAsyncCopy(uintptr_t lo, uintptr_t hi, void* stream) {
    if (pool_ == nullptr || !pool_->MaybeHolds(lo, hi)) return;
    SynchronizeIfDeferred(lo, hi, stream);
  }

  // An async host-to-device copy from host memory [lo, hi) is about to be
  // queued: true if the program unregistered (part of) it (a deferred
  // entry). A pageable source is taken as of the call without waiting for
  // the stream, so the hook copies it through lazypin's own scratch
  // (hooks_driver.cc, StagedHtoD) rather than synchronizing the stream.
  // Inline: nothing deferred costs one relaxed load.
  bool CopiesFromDeferred(uintptr_t lo, uintptr_t hi) {
    return pool_ != nullptr && pool_->MaybeHolds(lo, hi) && HoldsDeferred(lo, hi);
  }
  // Whether `stream` has no work in flight (DispatchEnv::StreamIdle): then
  // such a copy may run pinned and be waited for (AfterAsyncCopy), a wait
  // for nothing but itself.
  bool StreamIdle(void* stream);

  // A copy is about to move host memory [lo, hi) (every copy form,
  // hooks_driver.cc). The driver copies through a registration it holds, so
  // where a deferred one may hold that memory, the kernel watch's page
  // changes are applied first (Pool::ApplyPageChanges, in MemWatch::Drain's
  // order: every change whose system call returned, and every event the
  // kernel has queued): a registration whose pages changed is really
  // unregistered before the copy, which then reads the pages the program
  // sees; so is one the copy covers in part, which the driver would refuse
  // the copy over (Pool::BeforeCopy). Inline: nothing deferred costs one
  // relaxed load.
  bool MayCopyThroughDeferred(uintptr_t lo, uintptr_t hi) const {
    return pool_ != nullptr && pool_->MaybeHolds(lo, hi);
  }
  void BeforeCopy(uintptr_t lo, uintptr_t hi) {
    if (MayCopyThroughDeferred(lo, hi)) ApplyPageChangesBeforeCopy(lo, hi);
  }

  // A graph's memcpy node names host memory [lo, hi), and the graph is being
  // recorded, instantiated or launched: deferred entries there are really
  // unregistered first (EvictReason::kGraph), so that the driver finds that
  // memory as the program left it, pageable, as without lazypin. Inline:
  // nothing deferred costs one relaxed load.
  void BeforeGraphUse(uintptr_t lo, uintptr_t hi) {
    if (MayCopyThroughDeferred(lo, hi)) ReleaseForGraph(lo, hi);
  }

  Pool* pool() const { return pool_; }
  HostAllocCache* host_cache() const { return host_cache_; }

 private:
  Outcome Act(const ProgramCall& call, absl::FunctionRef<int()> real, RuntimeFrame::Wait wait);
  // The frame protocol, both sides. ThroughRuntime: cudart's `real` runs with
  // `frame` open on this thread; the outcome its driver calls reported, with
  // cudart's own answer as the result. IntoFrame: a driver call cudart makes
  // for the frame open on this thread (`act`, run with no frame open: a
  // driver call made from inside it is not cudart's) reports into it.
  static Outcome ThroughRuntime(RuntimeFrame& frame, absl::FunctionRef<int()> real);
  static int IntoFrame(RuntimeFrame& frame, absl::FunctionRef<Outcome()> act);
  // The implicit wait before a deferral (see the constructor): false if the
  // unregister must be forwarded.
  bool WaitBeforeDefer(Context ctx);
  bool HoldsDeferred(uintptr_t lo, uintptr_t hi);
  void SynchronizeIfDeferred(uintptr_t lo, uintptr_t hi, void* stream);
  void ApplyPageChangesBeforeCopy(uintptr_t lo, uintptr_t hi);
  void ReleaseForGraph(uintptr_t lo, uintptr_t hi);
  RegisterRequest Request(const ProgramCall& call, Context ctx);
  void Record(const ProgramCall& call, const Outcome& outcome, int64_t t0);
  // `origin`: the API the program called (the runtime's for cudart's driver
  // calls), part of what a cached block must match: cudart reports flags of
  // its own for what it allocated (cudaMallocHost's block is not a fresh
  // cudaHostAlloc(Portable|Mapped) block, though cudart asks the driver the same).
  Outcome HostAct(const ProgramCall& call, Api origin, void** out, absl::FunctionRef<int()> real);
  // The pool's and the cache's state in `device`'s primary context
  // (`primary`; null: every context of the device) goes.
  void DropPrimary(int device, Context primary, bool forget_in_use);
  // Any call on [lo, hi) other than a host allocation's own: cached (freed)
  // host blocks there are really freed first, so the driver answers as for
  // freed memory. Returns how many.
  int FreeCachedHostBlocks(uintptr_t lo, uintptr_t hi, EvictReason reason);
  // The same for the range a register or unregister names: once per program
  // call (the runtime call's, not again for the driver call cudart makes).
  void FreeCachedHostBlocksUnder(const ProgramCall& call);

  DispatchEnv* const env_;
  CallSink* const sink_;
  Pool* const pool_;
  const bool unregister_wait_;
  HostAllocCache* const host_cache_;
};

}  // namespace lazypin
