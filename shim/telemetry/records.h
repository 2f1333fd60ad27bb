// records: the log's JSON records (docs/log-format.md), formatted here and
// nowhere else. Each function returns one line without its newline.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "config.h"
#include "dispatch.h"
#include "types.h"

namespace lazypin {

struct HeaderInfo {
  const char* version;
  int pid;
  std::string exe;
  std::string cmdline;  // /proc/self/cmdline: arguments separated by NULs
  Mode requested;
  Mode effective;
  std::string why_effective;  // why effective differs from requested, else empty
  std::string host;
  const char* watch;          // "uffd" (the kernel watch is on) or "hooks"
  std::string watch_reason;   // why not the kernel watch, else empty
  int64_t start_unix_ns;
  int driver_version;  // 0: unknown
  const Config* config;
  std::string log_path;  // the file actually written
};
std::string HeaderRecord(const HeaderInfo& info);

// A call or evict record, formatted into a buffer that lives on the caller's
// stack: the per-call path allocates nothing. Both records fit (every field
// has a bounded width); longer text would be cut, never overrun.
class ShortRecord {
 public:
  static constexpr size_t kCapacity = 480;
  std::string_view view() const { return std::string_view(data_, size_); }
  char* data() { return data_; }
  void set_size(size_t size) { size_ = size < kCapacity ? size : kCapacity; }

 private:
  char data_[kCapacity];
  size_t size_ = 0;
};

// `stack`: the id of the call's native stack (callsite.h), 0 for none.
ShortRecord CallRecordLine(int64_t t_ns, int tid, const CallRecord& record, int stack = 0);
ShortRecord EvictRecordLine(int64_t t_ns, int tid, uintptr_t ptr, size_t bytes, EvictReason reason,
                            int result, int64_t latency_ns, const ReleaseWait& wait,
                            int stack = 0);
// The host-allocation cache really freed a block the program had freed (a
// "host_release" record: same fields as an evict record).
ShortRecord HostReleaseRecordLine(int64_t t_ns, int tid, uintptr_t ptr, size_t bytes,
                                  EvictReason reason, int result, int64_t latency_ns,
                                  const ReleaseWait& wait);
struct AutoPinRecord;
// {"type":"autopin",...}: lazypin registered a copy's pageable host range (auto_pin.h).
ShortRecord AutoPinRecordLine(int64_t t_ns, int tid, const AutoPinRecord& record);
std::string WarningRecordLine(int64_t t_ns, std::string_view message);

// The summary a signal leaves ({"type":"summary","t_ns":N,"ended_by":"SIGTERM"}),
// written into `buf` without allocating: async-signal-safe. Returns its length.
size_t SignalSummaryLine(char* buf, size_t capacity, int64_t t_ns, const char* ended_by);

}  // namespace lazypin
