// recorder: the log, statistics, call sites and NVTX (see recorder.h).
#include "recorder.h"

#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include "fmt/format.h"
#include "nvtx.h"
#include "pyframe.h"
#include "records.h"
#include "thread_state.h"

namespace lazypin {
namespace {

thread_local int t_tid LAZYPIN_TLS = 0;

int ThreadId() {
  if (t_tid == 0) t_tid = static_cast<int>(syscall(SYS_gettid));
  return t_tid;
}

// An address inside lazypin's own object, so that call sites leave its frames out.
void OwnCode() {}

}  // namespace

Recorder::Recorder(const Config& config, int64_t start_mono_ns, const std::string& log_path,
                   void (*on_first_record)())
    : config_(config), start_mono_ns_(start_mono_ns), on_first_record_(on_first_record) {
  log_ = Log::Deferred(log_path,
                       [this](const LogEntry& entry, std::string* line) { FormatEntry(entry, line); });
  if (config_.stacks != StackMode::kOff) {
    sites_ = std::make_unique<CallSites>(reinterpret_cast<const void*>(&OwnCode));
  }
}

bool Recorder::Start(std::function<std::vector<std::string>(const std::string& path)> preamble) {
  return log_->Start(std::move(preamble));
}

void Recorder::CallStarts(const ProgramCall& call) { nvtx::CallBegins(call.api); }

std::optional<uint64_t> StackKey(StackMode mode, Action action, uint64_t what,
                                 const ProgramCall& call, bool python_possible) {
  if (mode == StackMode::kAll) return 0;
  if (action == Action::kHit || action == Action::kDeferred) return std::nullopt;
  if (call.caller.pc != 0 && call.via != Via::kGetProc && !python_possible) {
    return ((what * 0x9e3779b97f4a7c15u) ^ (call.caller.pc * 0xff51afd7ed558ccdu) ^
            (call.caller.frame * 0xc4ceb9fe1a85ec53u) ^ (call.bytes * 0x94d049bb133111ebu)) |
           1;
  }
  return ((what * 0x9e3779b97f4a7c15u) ^
          (reinterpret_cast<uintptr_t>(call.ptr) * 0xff51afd7ed558ccdu) ^ call.bytes) |
         1;
}

int Recorder::StackOf(Action action, uint64_t what, const ProgramCall& call) {
  if (!sites_ || t_own_thread) return 0;
  const std::optional<uint64_t> key =
      StackKey(config_.stacks, action, what, call, PythonFramePossible());
  if (!key) return 0;
  return sites_->CaptureOnce(
      *key, CallSites::Emit{[this](std::string&& line) { log_->Write(std::move(line)); },
                           [this](int id) {
                             LogEntry entry;
                             entry.kind = LogEntry::Kind::kStack;
                             entry.stack = static_cast<int16_t>(id);
                             log_->Write(entry);
                           }});
}

void Recorder::Record(const CallRecord& record) {
  nvtx::CallEnds(record.action, record.reason);
  // A new stack's lines go into the ring first, from this thread: before the record naming it.
  const int stack =
      StackOf(record.action, static_cast<uint64_t>(record.call.api) << 8 | record.call.flags, record.call);
  LogEntry entry;
  entry.kind = LogEntry::Kind::kCall;
  entry.api = static_cast<uint8_t>(record.call.api);
  entry.via = static_cast<uint8_t>(record.call.via);
  entry.action = static_cast<uint8_t>(record.action);
  entry.reason = static_cast<uint8_t>(record.reason);
  entry.result = record.result;
  entry.tid = ThreadId();
  entry.call.flags = record.call.flags;
  entry.call.evicted = record.evicted;
  entry.t_ns = record.end_ns - start_mono_ns_;
  entry.latency_ns = record.latency_ns;
  entry.ptr = reinterpret_cast<uintptr_t>(record.call.ptr);
  entry.bytes = record.call.bytes;
  entry.stack = static_cast<int16_t>(stack);
  entry.device = static_cast<int8_t>(record.device);
  log_->Write(entry);
  log_->CreateFileNow();
  on_first_record_();
}

void Recorder::OnEvict(uintptr_t ptr, size_t bytes, EvictReason reason, int result,
                       int64_t latency_ns, const ReleaseWait& wait) {
  nvtx::Evicted(reason, wait.forced);
  // No stack: an eviction may run in a memory hook called from a signal
  // handler, where neither the unwinder's table lock nor Python may be taken.
  LogEntry entry;
  entry.kind = LogEntry::Kind::kEvict;
  entry.reason = static_cast<uint8_t>(reason);
  entry.forced = wait.forced;
  entry.result = result;
  entry.tid = ThreadId();
  entry.t_ns = SinceStart();
  entry.latency_ns = latency_ns;
  entry.ptr = ptr;
  entry.bytes = bytes;
  entry.waited_ns = wait.waited_ns;
  entry.stack = 0;
  log_->Write(entry);
}

void Recorder::FormatEntry(const LogEntry& e, std::string* line) {
  switch (e.kind) {
    case LogEntry::Kind::kCall: {
      const Api api = static_cast<Api>(e.api);
      const Action action = static_cast<Action>(e.action);
      const CallFacts facts = stats_.RecordCall(api, e.bytes, e.result, e.latency_ns, action, e.tid,
                                                e.t_ns, e.call.evicted);
      if (PastLogBound(e.t_ns, line)) {
        tally_.AddCall(api, action, e.bytes, e.result, e.latency_ns, e.call.evicted,
                       static_cast<PassReason>(e.reason), e.stack, facts);
        return;
      }
      const CallRecord record{
          ProgramCall{api, static_cast<Via>(e.via), reinterpret_cast<void*>(e.ptr), e.bytes,
                      e.call.flags},
          e.result, e.latency_ns, action, e.call.evicted, static_cast<PassReason>(e.reason),
          0, e.device};
      line->append(CallRecordLine(e.t_ns, e.tid, record, e.stack).view());
      log_bytes_ += line->size() + 1;
      return;
    }
    case LogEntry::Kind::kEvict: {
      stats_.RecordEvict(e.latency_ns, e.result, e.tid, e.t_ns);
      if (PastLogBound(e.t_ns, line)) {
        tally_.AddEvict(static_cast<EvictReason>(e.reason), e.result, e.forced, e.bytes, e.latency_ns);
        return;
      }
      ReleaseWait wait;
      wait.waited_ns = e.waited_ns;
      wait.forced = e.forced;
      line->append(EvictRecordLine(e.t_ns, e.tid, e.ptr, e.bytes, static_cast<EvictReason>(e.reason),
                                   e.result, e.latency_ns, wait, e.stack)
                       .view());
      log_bytes_ += line->size() + 1;
      return;
    }
    case LogEntry::Kind::kStack:
      *line = sites_->StackLine(e.stack);
      return;
    case LogEntry::Kind::kDropped:
      *line = WarningRecordLine(
          SinceStart(), fmt::format("{} log records were dropped: the log's ring of {} records "
                                    "stayed full for 50 ms (the writer could not keep up)",
                                    e.bytes, LogRing::kSlots));
      fprintf(stderr, "lazypin: %s log records were dropped (the log could not keep up)\n",
              std::to_string(e.bytes).c_str());
      return;
    case LogEntry::Kind::kText:
      return;  // the log writes those itself
  }
}

bool Recorder::PastLogBound(int64_t t_ns, std::string* line) {
  if (!log_cut_) {
    if (config_.log_max == 0 || log_bytes_ < config_.log_max) return false;
    log_cut_ = true;
    log_cut_ns_ = last_tally_ns_ = t_ns;
    *line = fmt::format(R"({{"type":"log_cut","t_ns":{},"log_max":{}}})", t_ns, config_.log_max);
    return true;
  }
  if (t_ns - last_tally_ns_ >= tally_interval_ns_) {
    last_tally_ns_ = t_ns;
    tally_interval_ns_ = std::min(2 * tally_interval_ns_, kTallyEveryNs);
    *line = tally_.Record(t_ns, log_cut_ns_);
  }
  return true;
}

void Recorder::OnHostRelease(uintptr_t ptr, size_t bytes, EvictReason reason, int result,
                             int64_t latency_ns, const ReleaseWait& wait) {
  // A release may be made because memory ran out (kept memory yielding to
  // an allocation that failed): a record that cannot be had is dropped.
  try {
    log_->Write(std::string(
        HostReleaseRecordLine(SinceStart(), ThreadId(), ptr, bytes, reason, result, latency_ns, wait)
            .view()));
  } catch (const std::bad_alloc&) {
    log_->CountDropped();
  }
}

void Recorder::RecordAutoPin(const AutoPinRecord& record) {
  if (record.result != kCudaSuccess) stats_.RecordAutoPinFailure();
  nvtx::AutoPinned(record.result == kCudaSuccess);
  log_->Write(std::string(AutoPinRecordLine(SinceStart(), ThreadId(), record).view()));
  log_->CreateFileNow();
  on_first_record_();
}

void Recorder::OnWarning(const std::string& message) {
  fprintf(stderr, "lazypin: %s\n", message.c_str());
  log_->Write(WarningRecordLine(SinceStart(), message));
}

void Recorder::Finish(const PoolCounters& counters, bool deferring, const HostAllocCounters* host,
                      const AutoPinCopyStats* copies) {
  // The summary is made once the writer has counted every record.
  log_->Close([&] {
    const int64_t now = SinceStart();
    const std::string tally = log_cut_ ? tally_.Record(now, log_cut_ns_) + "\n" : "";
    std::string summary = stats_.SummaryJson(counters, now, "exit", host, copies);
    if (sites_ && !summary.empty() && summary.back() == '}') {  // one object: the stacks' counts go last
      summary.insert(summary.size() - 1, fmt::format(R"(,"stacks":{{"unwound":{},"unique":{}}})",
                                                     sites_->unwound(), sites_->unique()));
    }
    return tally + summary;
  });
  // No file: the writer said why on stderr when it could not create it.
  std::string log_note;
  const std::string failure = log_->failure();
  if (log_->has_file()) {
    log_note = failure.empty()
                   ? fmt::format("lazypin: log: {}\n", log_->path())
                   : fmt::format("lazypin: log {} is incomplete: {}\n", log_->path(), failure);
  }
  if (config_.summary) {
    const std::string text = stats_.SummaryText(counters, deferring, host, copies) + log_note;
    fputs(text.c_str(), stderr);
  } else if (!failure.empty() && log_->has_file()) {
    fputs(log_note.c_str(), stderr);
  }
}

void Recorder::FinishFromSignal(const char* ended_by) {
  log_->DrainFromSignal(500);
  char line[160];
  const size_t len = SignalSummaryLine(line, sizeof line, SinceStart(), ended_by);
  log_->WriteDirect(std::string_view(line, len));
}

}  // namespace lazypin
