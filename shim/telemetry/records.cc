// records: JSON formatting of the log's records (see records.h).
#include "records.h"

#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <string_view>

#include "fmt/compile.h"
#include "fmt/format.h"
#include "auto_pin.h"
#include "json.h"

namespace lazypin {

std::string HeaderRecord(const HeaderInfo& h) {
  std::string argv;
  for (size_t i = 0; i < h.cmdline.size();) {
    const size_t end = h.cmdline.find('\0', i);
    const size_t stop = end == std::string::npos ? h.cmdline.size() : end;
    argv += (argv.empty() ? "" : ",") + JsonString(h.cmdline.substr(i, stop - i));
    i = stop + 1;
  }
  Config shown = *h.config;
  shown.log_path = h.log_path;
  // The launcher's rank variables (torchrun, MPI, Slurm) that are set: the
  // report's rank of the process (docs/log-format.md, header "env").
  std::string env;
  for (const char* name : {"RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK",
                           "SLURM_PROCID"}) {
    const char* value = getenv(name);
    if (value != nullptr) env += fmt::format("{}{}:{}", env.empty() ? "" : ",", JsonString(name), JsonString(value));
  }
  return fmt::format(
      R"({{"type":"header","format":1,"lazypin":"{}","pid":{},"exe":{},"argv":[{}],"mode":"{}",)"
      R"("mode_requested":"{}","mode_reason":{},"host":{},"watch":"{}","watch_reason":{},)"
      R"("start_unix_ns":{},"driver_version":{},"env":{{{}}},"config":{}}})",
      h.version, h.pid, JsonString(h.exe), argv, ModeName(h.effective), ModeName(h.requested),
      JsonString(h.why_effective), JsonString(h.host), h.watch, JsonString(h.watch_reason),
      h.start_unix_ns, h.driver_version, env, ConfigJson(shown));
}

namespace {

// Formatted in fmt's own stack buffer (its fast path; format_to_n into a
// char* checks every character, and measured slower than this copy).
ShortRecord Copied(const fmt::memory_buffer& text) {
  ShortRecord line;
  const size_t size = std::min(text.size(), ShortRecord::kCapacity);
  memcpy(line.data(), text.data(), size);
  line.set_size(size);
  return line;
}

}  // namespace

ShortRecord CallRecordLine(int64_t t_ns, int tid, const CallRecord& r, int stack) {
  fmt::memory_buffer text;
  fmt::format_to(std::back_inserter(text),
                 FMT_COMPILE(R"({{"type":"call","t_ns":{},"tid":{},"api":"{}","via":"{}","ptr":"{}",)"
                             R"("bytes":{},"flags":{},"result":{},"latency_ns":{},"action":"{}",)"
                             R"("evicted":{})"),
                 t_ns, tid, ApiName(r.call.api), ViaName(r.call.via), r.call.ptr, r.call.bytes,
                 r.call.flags, r.result, r.latency_ns, ActionName(r.action), r.evicted);
  if (r.reason != PassReason::kNone) {
    fmt::format_to(std::back_inserter(text), FMT_COMPILE(R"(,"reason":"{}")"), PassReasonName(r.reason));
  }
  if (stack > 0) fmt::format_to(std::back_inserter(text), FMT_COMPILE(R"(,"stack":{})"), stack);
  if (r.device >= 0) fmt::format_to(std::back_inserter(text), FMT_COMPILE(R"(,"device":{})"), r.device);
  text.push_back('}');
  return Copied(text);
}

namespace {

// A release of lazypin's own: an `evict` record (the pool) or a
// `host_release` record (the host-allocation cache); `stack` > 0 only for
// the former.
ShortRecord ReleaseRecordLine(std::string_view type, int64_t t_ns, int tid, uintptr_t ptr,
                              size_t bytes, EvictReason reason, int result, int64_t latency_ns,
                              const ReleaseWait& wait, int stack) {
  fmt::memory_buffer text;
  fmt::format_to(
      std::back_inserter(text),
      FMT_COMPILE(R"({{"type":"{}","t_ns":{},"tid":{},"ptr":"{}","bytes":{},"reason":"{}",)"
                  R"("result":{},"latency_ns":{},"waited_ns":{})"),
      type, t_ns, tid, reinterpret_cast<void*>(ptr), bytes, EvictReasonName(reason), result,
      latency_ns, wait.waited_ns);
  if (wait.forced) fmt::format_to(std::back_inserter(text), FMT_COMPILE(R"(,"forced":true)"));
  if (stack > 0) fmt::format_to(std::back_inserter(text), FMT_COMPILE(R"(,"stack":{})"), stack);
  text.push_back('}');
  return Copied(text);
}

}  // namespace

ShortRecord EvictRecordLine(int64_t t_ns, int tid, uintptr_t ptr, size_t bytes, EvictReason reason,
                            int result, int64_t latency_ns, const ReleaseWait& wait, int stack) {
  return ReleaseRecordLine("evict", t_ns, tid, ptr, bytes, reason, result, latency_ns, wait, stack);
}

ShortRecord HostReleaseRecordLine(int64_t t_ns, int tid, uintptr_t ptr, size_t bytes,
                                  EvictReason reason, int result, int64_t latency_ns,
                                  const ReleaseWait& wait) {
  return ReleaseRecordLine("host_release", t_ns, tid, ptr, bytes, reason, result, latency_ns, wait,
                           0);
}

ShortRecord AutoPinRecordLine(int64_t t_ns, int tid, const AutoPinRecord& r) {
  fmt::memory_buffer text;
  fmt::format_to(
      std::back_inserter(text),
      FMT_COMPILE(R"({{"type":"autopin","t_ns":{},"tid":{},"api":"{}","via":"{}","ptr":"{}",)"
                  R"("bytes":{},"dir":"{}","result":{},"latency_ns":{},"action":"autopin"}})"),
      t_ns, tid, r.api, ViaName(r.via), reinterpret_cast<void*>(r.ptr), r.bytes,
      r.to_device ? "htod" : "dtoh", r.result, r.latency_ns);
  return Copied(text);
}

std::string WarningRecordLine(int64_t t_ns, std::string_view message) {
  return fmt::format(R"({{"type":"warning","t_ns":{},"message":{}}})", t_ns, JsonString(message));
}

size_t SignalSummaryLine(char* buf, size_t capacity, int64_t t_ns, const char* ended_by) {
  size_t len = 0;
  const auto put = [&](const char* s) {
    while (*s != '\0' && len < capacity) buf[len++] = *s++;
  };
  char digits[24];
  int n = 0;
  uint64_t t = t_ns < 0 ? 0 : static_cast<uint64_t>(t_ns);
  do { digits[n++] = static_cast<char>('0' + t % 10); t /= 10; } while (t > 0 && n < 23);
  put(R"({"type":"summary","t_ns":)");
  while (n > 0 && len < capacity) buf[len++] = digits[--n];
  put(R"(,"ended_by":")");
  put(ended_by);
  put(R"("})");
  return len;
}

}  // namespace lazypin
