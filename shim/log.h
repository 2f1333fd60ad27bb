// log: the JSON Lines file (docs/log-format.md), written by an spdlog
// asynchronous logger. A calling thread only appends its record to a batch
// under a short lock (no allocation in the common case, no wake-up of another
// thread); a flusher thread hands the batch to the spdlog logger every 10 ms,
// whose writer thread writes it. Owns: opening the file safely, those threads,
// draining at exit and on signals, and giving up cleanly (one message) when
// the file cannot be written.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include <condition_variable>
#include <mutex>
#include <string_view>

#include "absl/base/thread_annotations.h"

namespace spdlog {
class async_logger;
namespace details { class thread_pool; }
}  // namespace spdlog

namespace lazypin {

class Log {
 public:
  // Opens `path` for a new log: created with mode 0600, never through a
  // symlink, never a file of another user. On failure returns null and sets
  // `error` to one line saying why.
  static std::unique_ptr<Log> Open(const std::string& path, std::string* error);

  // Adds one record (no newline) to the batch.
  void Write(std::string_view line);
  // Adds `last_line` (if any) as the last record, writes everything, and
  // drops any later Write(). Idempotent.
  void Close(std::string_view last_line = {});
  // From a signal handler: waits up to `timeout_ms` for the writer to catch
  // up, then writes the batch directly if no thread is adding to it.
  void DrainFromSignal(int timeout_ms);
  // Writes one line directly, bypassing the queue (signal handlers, after Close).
  void WriteDirect(std::string_view line);

  // Set once a write failed (disk full, file size limit): the error, else empty.
  std::string failure() const;
  const std::string& path() const { return path_; }

 private:
  Log(int fd, std::string path);
  friend class FdSink;
  void Flush();  // hands the batch to the spdlog logger
  void WaitDrained(int timeout_ms) const;

  const int fd_;
  const std::string path_;
  std::atomic<uint64_t> queued_{0};
  std::atomic<uint64_t> written_{0};
  std::atomic<int> failed_errno_{0};
  std::atomic<uint64_t> offset_{0};
  uint64_t size_limit_ = ~uint64_t{0};
  std::atomic<bool> closed_{false};
  std::shared_ptr<spdlog::details::thread_pool> pool_;
  std::shared_ptr<spdlog::async_logger> logger_;
  std::mutex batch_mu_;
  std::string batch_ ABSL_GUARDED_BY(batch_mu_);
  std::mutex flusher_mu_;
  std::condition_variable flusher_wake_;
  bool stop_flusher_ ABSL_GUARDED_BY(flusher_mu_) = false;
  std::thread flusher_;
};

}  // namespace lazypin
