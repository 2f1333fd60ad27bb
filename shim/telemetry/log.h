// log: the JSON Lines file (docs/log-format.md). A calling thread only
// copies its record, a fixed-size LogEntry, into a lock-free ring (LogRing:
// no lock, no allocation, no system call, no formatting); one writer thread
// of lazypin's takes the records in order every 10 ms (sooner when the ring
// is half full), has them formatted (and counted: the Formatter keeps the
// statistics, so that they cost the caller nothing either) and writes them.
// A full ring makes the caller wait for the writer, at most 50 ms; past that
// the record is dropped and counted, and the writer writes how many were
// dropped (a Kind::kDropped entry handed to the Formatter). Owns the writer
// thread, draining at exit and on signals, and giving up cleanly (one
// message) when the file cannot be created or written; the file's name and
// its safe creation are log_path.h's.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "lazypin_thread.h"
#include "thread_state.h"

#include <condition_variable>
#include <mutex>
#include <functional>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "log_entry.h"
#include "descriptors.h"
#include "log_path.h"
#include "log_ring.h"

namespace lazypin {

class Log {
 public:
  // Turns a binary entry into its line, on the writer thread, in order. Also
  // called with a Kind::kDropped entry (`bytes`: how many records were
  // dropped since the last such entry), and for records that are not written
  // (no file): the caller may count them there.
  // The line goes into `line` (empty on entry, no newline).
  using Formatter = std::function<void(const LogEntry& entry, std::string* line)>;

  // Creates a new log file at `path` (CreateLogFile's policy) and starts the
  // writer. On failure returns null and sets `error` to one line saying why.
  // When the name was taken, the log goes to a suffixed name (path() says
  // which) and one line on stderr says so.
  static std::unique_ptr<Log> Open(const std::string& path, std::string* error);

  // A log whose file is created later, by Start(): no file, no thread yet.
  // Records written meanwhile are kept in memory.
  static std::unique_ptr<Log> Deferred(std::string path, Formatter format);
  // The lines a log starts with (the header, warnings), made by the writer
  // thread once the file exists; `path` is the name it was created under.
  using Preamble = std::function<std::vector<std::string>(const std::string& path)>;
  // For a Deferred() log, once: starts the writer thread, which waits for
  // the file (CreateFileNow), writes `preamble`'s lines, then the records
  // written so far and from then on. When the file cannot be created,
  // records are dropped. False when no thread could be started (then
  // records are dropped too).
  bool Start(Preamble preamble);
  // Creates a Deferred() log's file on this thread (Open's policy, its
  // message on stderr), once; later calls: one load. On a program thread,
  // inside a call it made (the first recorded call): the descriptors the
  // creation opens for a moment are never one another thread of the program
  // could get meanwhile from open().
  void CreateFileNow() {
    if (!create_requested_.load(std::memory_order_relaxed)) CreateFileSlow();
  }

  // Adds one record: a binary entry (the hot path: a copy into the ring) or a
  // line (no newline; moved to the heap: rare records only).
  void Write(const LogEntry& entry) {
    if (closed_.load(std::memory_order_acquire)) return;
    const uint64_t pos = ring_.TryPush(entry);
    if (pos == 0) return PushSlow(entry);
    // The first record (the writer creates the file), then every half ring
    // (the writer hurries).
    if (pos == 1 || (pos & (LogRing::kSlots / 2 - 1)) == 0) Wake();
  }
  void Write(std::string line);
  // A record that could not be made (no memory for it): counted as dropped.
  void CountDropped() { dropped_.fetch_add(1, std::memory_order_relaxed); }
  // Waits for the file's creation and for the writer to take every record,
  // adds `last_line()` (made then, after the Formatter saw every record) as
  // the last record, writes everything, and drops any later Write(). Idempotent.
  void Close(const std::function<std::string()>& last_line);
  void Close(std::string_view last_line = {});
  // From a signal handler: wakes the writer and waits up to `timeout_ms` for
  // the file to exist and the writer to have written every record made so far.
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
  Log(std::string path, Formatter format) : path_(std::move(path)), format_(std::move(format)) {}
  bool StartWriter(Preamble preamble);  // false: no thread
  void Adopt(CreatedLogFile& file);  // the created file's path and limit (the caller then sets kWriting)
  void CreateFileSlow();
  // `data` then `tail` to the file while the descriptor is lazypin's
  // (HeldFd::Use); false with errno set otherwise.
  bool WriteOwn(std::string_view data, std::string_view tail);
  void GiveUp();                         // no file: kGaveUp, records formatted and dropped
  void RunWriter(Preamble preamble);     // the writer thread's body
  void Drain();                          // the consumer: takes, formats and writes every record
  void PushSlow(const LogEntry& entry);  // the ring is full
  void Wake();                           // the writer looks now
  bool WriteLine(std::string_view data); // `data` and a newline, to the file

  HeldFd fd_;  // taken where the file is created, before file_state_ becomes kWriting
  std::string path_;
  std::atomic<bool> create_requested_{false};
  std::atomic<bool> created_{false};  // CreateFileSlow ran: created_file_ is the writer's
  CreatedLogFile created_file_;
  std::atomic<int> file_state_{kCreating};
  std::atomic<uint64_t> written_upto_{0};  // records taken and written (or dropped: no file)
  std::atomic<uint64_t> dropped_{0};       // records the full ring refused
  uint64_t dropped_reported_ = 0;          // the consumer's: dropped_ at its last kDropped
  std::atomic<bool> writer_running_{false};
  std::atomic<bool> stop_writer_{false};
  std::atomic<uint32_t> wake_{0};           // futex: the writer sleeps on it
  std::atomic<bool> wake_pending_{false};   // a Wake() since the writer last looked
  std::string chunk_;                       // the consumer's output buffer
  std::string line_;                        // the consumer's: one formatted record
  std::atomic<int> failed_errno_{0};
  std::atomic<uint64_t> offset_{0};
  uint64_t size_limit_ = ~uint64_t{0};
  std::atomic<bool> closed_{false};
  const Formatter format_;
  std::mutex close_mu_;  // Close() once
  LogRing ring_;
  LazypinThread writer_;
};

}  // namespace lazypin
