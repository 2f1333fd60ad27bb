// log: the JSON Lines file (docs/log-format.md). A calling thread only
// appends its record to a batch under a short lock (no allocation in the
// common case, no wake-up of another thread); one writer thread of lazypin's
// writes the batch to the file every 10 ms. Owns: creating the file safely
// (no link followed, nothing existing ever opened, no open that can block),
// the log's default name, the writer thread, draining at exit and on
// signals, and giving up cleanly (one message) when the file cannot be
// created or written.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include <condition_variable>
#include <mutex>
#include <functional>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"

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
  // Creates a new log file at `path` (CreateLogFile's policy) and starts the
  // writer. On failure returns null and sets `error` to one line saying why.
  // When the name was taken, the log goes to a suffixed name (path() says
  // which) and one line on stderr says so.
  static std::unique_ptr<Log> Open(const std::string& path, std::string* error);

  // A log whose file is created later, by Start(): no file, no thread yet.
  // Records written meanwhile are kept in memory.
  static std::unique_ptr<Log> Deferred(std::string path);
  // The lines a log starts with (the header, warnings), made by the writer
  // thread once the file exists; `path` is the name it was created under.
  using Preamble = std::function<std::vector<std::string>(const std::string& path)>;
  // For a Deferred() log, once: starts the writer thread, which creates the
  // file (Open's policy, its messages on stderr), writes `preamble`'s lines,
  // then the records written so far and from then on. When the file cannot
  // be created, records are dropped. False when no thread could be started
  // (then records are dropped too).
  bool Start(Preamble preamble);

  // Adds one record (no newline) to the batch.
  void Write(std::string_view line);
  // Waits for the file's creation, adds `last_line` (if any) as the last
  // record, writes everything, and drops any later Write(). Idempotent.
  void Close(std::string_view last_line = {});
  // From a signal handler: waits up to `timeout_ms` for the file to exist and
  // the writer to catch up, then writes the batch directly if no thread is
  // adding to it.
  void DrainFromSignal(int timeout_ms);
  // Writes one line directly, bypassing the batch (signal handlers, after
  // Close); dropped while the file does not exist.
  void WriteDirect(std::string_view line);

  // Set once a write failed (disk full, file size limit): the error, else empty.
  std::string failure() const;
  // Whether the file exists and is being written (false while the writer is
  // still creating it, and for good once that failed).
  bool has_file() const;
  // The file's name: valid once created (after Open, or after Close).
  const std::string& path() const { return path_; }

 private:
  enum FileState : int { kCreating, kWriting, kGaveUp };
  explicit Log(std::string path) : path_(std::move(path)) {}
  bool StartWriter(Preamble preamble);  // false: no thread
  void Adopt(int fd, std::string path);  // the created file (the caller then sets kWriting)
  void GiveUp();                         // no file: kGaveUp, the batch dropped
  void RunWriter(Preamble preamble);     // the writer thread's body
  void Flush();                          // writes the batch
  bool WriteLine(std::string_view data); // `data` and a newline, to the file
  void WaitDrained(int timeout_ms) const;

  int fd_ = -1;  // set once, before file_state_ becomes kWriting
  std::string path_;
  std::atomic<int> file_state_{kCreating};
  std::atomic<uint64_t> queued_{0};   // batches taken by Flush
  std::atomic<uint64_t> written_{0};  // batches Flush finished writing
  std::atomic<int> failed_errno_{0};
  std::atomic<uint64_t> offset_{0};
  uint64_t size_limit_ = ~uint64_t{0};
  std::atomic<bool> closed_{false};
  std::mutex batch_mu_;
  std::string batch_ ABSL_GUARDED_BY(batch_mu_);
  std::mutex writer_mu_;
  std::condition_variable writer_wake_;
  bool stop_writer_ ABSL_GUARDED_BY(writer_mu_) = false;
  std::thread writer_;
};

}  // namespace lazypin
