// recorder: where everything lazypin observes is told. Program calls
// (Record), lazypin's own releases (OnEvict, OnHostRelease), auto-pins and
// warnings go into the log's lock-free ring as fixed-size entries; the log's
// writer thread counts each in the statistics and formats it (FormatEntry),
// off the caller's path. NVTX ranges and call-site stacks are taken here
// too. The exit summary and the fatal-signal line are written from here.
//
// Contract: every entry point but the constructor, Start and Finish may run
// on any thread, inside allocators and memory hooks; none allocates on the
// caller's thread except to capture a new call site's stack (never in an
// eviction: that may run in a signal handler's free).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "auto_pin.h"
#include "callsite.h"
#include "config.h"
#include "dispatch.h"
#include "host_alloc_cache.h"
#include "log.h"
#include "pool.h"
#include "stats.h"
#include "tally.h"
#include "sys.h"

namespace lazypin {

// The key a program call's stack is captured under (CallSites::CaptureOnce:
// unwound once per key; 0: every call, unwound each time), or none (no stack).
// `what` names the call's kind (its API and flags).
//  - LAZYPIN_STACKS=all: 0.
//  - Else only calls that reached the driver have one (a hit or a deferral
//    costs about a microsecond, a stack more).
//  - Natively, the call's caller: its return address, which names the line,
//    its frame address, which tells apart the callers of one wrapper that
//    call it at different stack addresses, and the size (callers of a
//    wrapper at the same stack address with the same size share the first
//    one's stack: a full unwind would tell them apart, at 2-4 us a call). A
//    first registration of each new buffer of a size from a known line is
//    then not unwound.
//  - Else the call's address and size: where a Python interpreter may be
//    the caller (`python_possible`: ctypes and libffi are the native caller
//    of every Python line, which a stack tells apart by its Python frame,
//    pyframe.h); for a driver entry point that cuGetProcAddress handed out,
//    whose caller is the runtime for every line of the program; and when the
//    caller is not known.
// Keys of calls that have one are odd: never 0.
std::optional<uint64_t> StackKey(StackMode mode, Action action, uint64_t what,
                                 const ProgramCall& call, bool python_possible);

class Recorder final : public CallSink,
                       public PoolObserver,
                       public HostAllocObserver,
                       public AutoPinSink {
 public:
  // `log_path`: the expanded path; `on_first_record`: called after each
  // program call recorded (cheap; the runtime installs its handlers once).
  Recorder(const Config& config, int64_t start_mono_ns, const std::string& log_path,
           void (*on_first_record)());

  // Starts the log's writer with `preamble` (the header and set-up's warnings).
  bool Start(std::function<std::vector<std::string>(const std::string& path)> preamble);

  void CallStarts(const ProgramCall& call) override;
  // One program call: 56 bytes into the ring.
  void Record(const CallRecord& record) override;

  // PoolObserver
  void OnEvict(uintptr_t ptr, size_t bytes, EvictReason reason, int result, int64_t latency_ns,
               const ReleaseWait& wait) override;
  void OnWarning(const std::string& message) override;
  // HostAllocObserver
  void OnHostRelease(uintptr_t ptr, size_t bytes, EvictReason reason, int result,
                     int64_t latency_ns, const ReleaseWait& wait) override;
  // AutoPinSink
  void RecordAutoPin(const AutoPinRecord& record) override;
  void OnFirstCopy() override { on_first_record_(); }

  // At exit: closes the log with the summary record and, with
  // LAZYPIN_SUMMARY, prints the summary on stderr.
  void Finish(const PoolCounters& counters, bool deferring, const HostAllocCounters* host,
              const AutoPinCopyStats* copies = nullptr);
  // From a fatal signal's handler (async-signal-safe): drains the ring and
  // appends the one-line summary.
  void FinishFromSignal(const char* ended_by);

  int64_t SinceStart() const { return MonotonicNs() - start_mono_ns_; }

 private:
  // The writer thread's formatter: counts the record, then formats it.
  void FormatEntry(const LogEntry& entry, std::string* line);
  // A program call's stack: 0 (none) unless LAZYPIN_STACKS asks for it.
  // `what` is the call's API and flags: with LAZYPIN_STACKS=1 each (what,
  // caller, size), or (what, address, size) where the caller names no line,
  // is unwound once (CallSites::CaptureOnce).
  int StackOf(Action action, uint64_t what, const ProgramCall& call);

  const Config& config_;
  const int64_t start_mono_ns_;
  void (*const on_first_record_)();
  std::unique_ptr<Log> log_;
  std::unique_ptr<CallSites> sites_;  // with LAZYPIN_STACKS on
  Stats stats_;                       // written by the log's writer thread
  // The log's bound (LAZYPIN_LOG_MAX): the writer thread's (then the exiting
  // thread's, once the writer has ended), as stats_.
  uint64_t log_bytes_ = 0;
  bool log_cut_ = false;
  int64_t log_cut_ns_ = 0, last_tally_ns_ = 0, tally_interval_ns_ = kTallyFirstNs;
  Tally tally_;
  // Past the bound: makes `line` the cut's record (once) or a tally record
  // (tally.h: after 10 s, then at doubling intervals up to 10 min). True: past
  // it (the caller counts the call in the tally).
  bool PastLogBound(int64_t t_ns, std::string* line);
};

}  // namespace lazypin
