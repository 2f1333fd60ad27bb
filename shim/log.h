// log: the JSON Lines file (docs/log-format.md), written by an spdlog
// asynchronous logger. A calling thread only appends its record to a batch
// under a short lock (no allocation in the common case, no wake-up of another
// thread); a flusher thread hands the batch to the spdlog logger every 10 ms,
// whose writer thread writes it. Owns: creating the file safely (no link
// followed, nothing existing ever opened, no open that can block), the log's
// default name, those threads, draining at exit and on signals, and giving up
// cleanly (one message) when the file cannot be written.
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

// `text` as a part of a file name: each byte outside [A-Za-z0-9._-] becomes
// '_' (so no '/', no '%', no space); "unknown" when `text` is empty.
std::string LogNamePart(std::string_view text);

// This machine's short host name: uname(2)'s nodename up to its first dot,
// as a LogNamePart ("unknown" when that is empty). What %h expands to.
std::string ShortHostName();

// The log path pattern used when LAZYPIN_LOG is not set, for ExpandLogPath:
// "lazypin-<program>-%h-%p.jsonl", `program` made a LogNamePart. Unique per
// host and process, in the current directory.
// Expands a log path pattern: %p to `pid`, %h to ShortHostName() (log.h),
// %% to a literal %; any other %, and a trailing one, stay as they are.
std::string ExpandLogPath(std::string_view pattern, int pid);

std::string DefaultLogPattern(std::string_view program);

// How CreateLogFile resolves the directory part of a path: kAuto uses
// openat2(RESOLVE_NO_SYMLINKS) where the kernel has it and the walk otherwise;
// kWalk always walks (one openat(O_PATH|O_NOFOLLOW|O_DIRECTORY) per component).
enum class LogPathResolver { kAuto, kWalk };

// The file-creating part of Log::Open. `fd` is the new file (or -1), `path`
// the name it was created under, `message` one line for stderr (no newline):
// why nothing was created, or, when the requested name was taken, where the
// log went; empty otherwise. The policy (docs/reliability.md):
//  - No component of `path` may be a symbolic link (magic links in /proc
//    included); a relative path is resolved from the current directory, whose
//    own path is not examined.
//  - Every log is an exclusive create, mode 0600: an existing file (a log of
//    another process, a user's file, a hard link to one) is never opened,
//    truncated or written. When the name is a regular file, the log is
//    created as <stem>.1.<ext>, <stem>.2.<ext>, ... (at most 1000 tries);
//    when it is anything else (a FIFO, a socket, a device, a directory, a
//    link), no log is written.
//  - No call can block: the create is O_NONBLOCK (cleared afterwards).
struct CreatedLogFile {
  int fd = -1;
  std::string path;
  std::string message;
};
CreatedLogFile CreateLogFile(const std::string& path,
                             LogPathResolver resolver = LogPathResolver::kAuto);

class Log {
 public:
  // Creates a new log file at `path` (CreateLogFile's policy). On failure
  // returns null and sets `error` to one line saying why. When the name was
  // taken, the log goes to a suffixed name (path() says which) and one line
  // on stderr says so.
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
