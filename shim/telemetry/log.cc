// log: the asynchronous JSON Lines writer (see log.h).
#include "lazypin_thread.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <linux/futex.h>
#include <sched.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <system_error>

#include "descriptors.h"
#include "sys.h"
#include "thread_state.h"

namespace lazypin {
namespace {

// write(2) all of `data`; false with errno set on failure. Never lets the
// file grow past RLIMIT_FSIZE: the kernel would send SIGXFSZ to the whole
// process, whose default action kills the host program.
bool WriteAll(int fd, const char* data, size_t size, std::atomic<uint64_t>* offset,
              uint64_t limit) {
  if (offset->load(std::memory_order_relaxed) + size > limit) {
    errno = EFBIG;
    return false;
  }
  offset->fetch_add(size, std::memory_order_relaxed);
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

std::unique_ptr<Log> Log::Open(const std::string& path, std::string* error) {
  CreatedLogFile file = CreateLogFile(path);
  if (file.fd < 0) {
    *error = std::move(file.message);
    return nullptr;
  }
  if (!file.message.empty()) fprintf(stderr, "%s\n", file.message.c_str());
  std::unique_ptr<Log> log(new Log(path, nullptr));
  log->fd_.Take(file.fd, file.dev, file.ino);
  log->Adopt(file);
  log->create_requested_.store(true, std::memory_order_relaxed);  // made: never again
  log->created_.store(true, std::memory_order_release);
  log->file_state_.store(kWriting, std::memory_order_release);
  if (!log->StartWriter(nullptr)) {
    *error = "lazypin: cannot start the log's writer thread; not writing a log file";
    return nullptr;  // the descriptor stays open: harmless, and never written
  }
  return log;
}

std::unique_ptr<Log> Log::Deferred(std::string path, Formatter format) {
  return std::unique_ptr<Log>(new Log(std::move(path), std::move(format)));
}

bool Log::Start(Preamble preamble) {
  if (StartWriter(std::move(preamble))) return true;
  GiveUp();
  return false;
}

bool Log::StartWriter(Preamble preamble) {
  try {
    writer_running_.store(true, std::memory_order_release);
    writer_ = StartThreadWithSignalsBlocked(
        [this, preamble = std::move(preamble)]() mutable { RunWriter(std::move(preamble)); });
    return true;
  } catch (const std::system_error&) {
    writer_running_.store(false, std::memory_order_release);
    return false;
  }
}

void Log::Adopt(CreatedLogFile& file) {
  struct rlimit limit;
  if (getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    size_limit_ = limit.rlim_cur;
  }
  path_ = std::move(file.path);
}

void Log::CreateFileSlow() {
  if (create_requested_.exchange(true, std::memory_order_acq_rel)) return;
  created_file_ = CreateLogFile(path_);
  // Held from its creation on, on this thread: the descriptor hooks keep it
  // out of the program's dup2 and close_range from now.
  if (created_file_.fd >= 0) fd_.Take(created_file_.fd, created_file_.dev, created_file_.ino);
  if (!created_file_.message.empty()) fprintf(stderr, "%s\n", created_file_.message.c_str());
  created_.store(true, std::memory_order_release);
  wake_.fetch_add(1, std::memory_order_release);
  FutexWake(&wake_, 1);
}

bool Log::WriteOwn(std::string_view data, std::string_view tail) {
  bool written = false;
  if (!fd_.Use([&](int fd) {
        written = WriteAll(fd, data.data(), data.size(), &offset_, size_limit_) &&
                  (tail.empty() || WriteAll(fd, tail.data(), tail.size(), &offset_, size_limit_));
      })) {
    errno = EBADF;
  }
  return written;
}

void Log::GiveUp() { file_state_.store(kGaveUp, std::memory_order_release); }

void Log::RunWriter(Preamble preamble) {
  // The file is created by the first recorded call's thread
  // (CreateFileNow): a process that never makes a call lazypin records gets
  // no file, and this thread sleeps until its exit.
  for (;;) {
    const uint32_t seen = wake_.load(std::memory_order_acquire);
    if (created_.load(std::memory_order_acquire) || stop_writer_.load(std::memory_order_acquire)) {
      break;
    }
    IdleWait(&wake_, seen, -1);
  }
  if (file_state_.load(std::memory_order_acquire) == kCreating &&
      created_.load(std::memory_order_acquire)) {
    CreatedLogFile& file = created_file_;
    if (file.fd < 0) {
      GiveUp();  // the records are still taken (and counted by the Formatter)
    } else {
      Adopt(file);
      // The preamble goes first: nothing else writes before kWriting.
      if (preamble) {
        for (const std::string& line : preamble(path_)) {
          if (!WriteLine(line)) break;
        }
      }
      file_state_.store(kWriting, std::memory_order_release);
    }
  }
  for (int round = 0;; ++round) {
    const uint32_t seen = wake_.load(std::memory_order_acquire);
    wake_pending_.store(false, std::memory_order_relaxed);
    Drain();
    // From the second round (10 ms on), the rest of the ring's first lap
    // takes no page fault in a caller.
    if (round == 1) ring_.Prefault();
    if (stop_writer_.load(std::memory_order_acquire)) break;
    IdleWait(&wake_, seen, 10000000);
  }
  Drain();
  writer_running_.store(false, std::memory_order_release);
}

void Log::Wake() {
  if (wake_pending_.exchange(true, std::memory_order_relaxed)) return;
  wake_.fetch_add(1, std::memory_order_release);
  FutexWake(&wake_, 1);
}

void Log::Write(std::string line) {
  if (closed_.load(std::memory_order_acquire)) return;
  LogEntry entry;
  entry.kind = LogEntry::Kind::kText;
  entry.text = new (std::nothrow) std::string(std::move(line));
  if (entry.text == nullptr) return CountDropped();
  const uint64_t pos = ring_.TryPush(entry);
  if (pos == 0) return PushSlow(entry);
  if (pos == 1) Wake();
}

void Log::PushSlow(const LogEntry& entry) {
  // The ring is full: the writer is behind (or not there yet, or waiting for
  // the file: made here then). Wait for it, at most 50 ms, then drop the
  // record and count it.
  CreateFileNow();
  const int64_t deadline = MonotonicNs() + 50000000;
  for (int spins = 0; writer_running_.load(std::memory_order_acquire); ++spins) {
    wake_pending_.store(false, std::memory_order_relaxed);
    Wake();
    if (ring_.TryPush(entry) != 0) return;
    if (MonotonicNs() > deadline) break;
    if (spins < 64) {
      sched_yield();
    } else {
      struct timespec pause = {0, 100000};
      nanosleep(&pause, nullptr);
    }
  }
  if (entry.kind == LogEntry::Kind::kText) delete entry.text;
  dropped_.fetch_add(1, std::memory_order_relaxed);
}

void Log::Drain() {
  const bool writing = file_state_.load(std::memory_order_acquire) == kWriting;
  if (file_state_.load(std::memory_order_acquire) == kCreating) return;  // kept until the file exists
  if (chunk_.capacity() == 0) chunk_.reserve(1 << 16);
  auto flush = [&] {
    if (!chunk_.empty() && writing && failed_errno_.load(std::memory_order_relaxed) == 0 &&
        !WriteOwn(chunk_, {})) {
      failed_errno_.store(errno == 0 ? EIO : errno, std::memory_order_relaxed);
    }
    chunk_.clear();
  };
  auto add = [&](std::string_view line) {
    if (!writing) return;
    chunk_.append(line.data(), line.size());
    chunk_.push_back('\n');
    if (chunk_.size() >= (1 << 16) - 1024) flush();
  };
  LogEntry entry;
  while (ring_.Pop(&entry)) {
    if (entry.kind == LogEntry::Kind::kText) {
      add(*entry.text);
      delete entry.text;
    } else if (format_) {
      line_.clear();
      format_(entry, &line_);
      if (!line_.empty()) add(line_);
    }
  }
  const uint64_t dropped = dropped_.load(std::memory_order_relaxed);
  if (dropped != dropped_reported_ && format_) {
    LogEntry note;
    note.kind = LogEntry::Kind::kDropped;
    note.bytes = dropped - dropped_reported_;
    dropped_reported_ = dropped;
    line_.clear();
    format_(note, &line_);
    add(line_);
  }
  flush();
  written_upto_.store(ring_.popped(), std::memory_order_release);
}

void Log::Close(std::string_view last_line) {
  const std::string line(last_line);
  Close([&line] { return line; });
}

void Log::Close(const std::function<std::string()>& last_line) {
  // Drain, but keep the object alive: other threads may still be in Write()
  // while the process exits.
  std::lock_guard<std::mutex> lock(close_mu_);
  if (closed_.exchange(true)) return;
  if (ring_.pushed() != 0) CreateFileNow();  // records, but no recorded call made the file
  stop_writer_.store(true, std::memory_order_release);
  wake_.fetch_add(1, std::memory_order_release);
  FutexWake(&wake_, 1);
  if (writer_.joinable()) writer_.join();  // the file exists (or never will) after this
  // This thread is the consumer now: what was written while the writer
  // stopped, or everything when no writer could be started.
  if (file_state_.load(std::memory_order_acquire) == kCreating) GiveUp();
  Drain();
  if (file_state_.load(std::memory_order_acquire) != kWriting) return;
  const std::string last = last_line();
  if (!last.empty()) WriteLine(last);
}

void Log::DrainFromSignal(int timeout_ms) {
  const uint64_t target = ring_.pushed();
  wake_.fetch_add(1, std::memory_order_release);
  FutexWake(&wake_, 1);
  for (int i = 0; i < timeout_ms; ++i) {
    const int state = file_state_.load(std::memory_order_acquire);
    if (state == kGaveUp || !writer_running_.load(std::memory_order_acquire)) return;
    if (state == kWriting && written_upto_.load(std::memory_order_acquire) >= target) return;
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, nullptr);
  }
}

bool Log::WriteLine(std::string_view line) {
  if (failed_errno_.load(std::memory_order_relaxed) != 0) return false;
  if (!WriteOwn(line, "\n")) {
    failed_errno_.store(errno == 0 ? EIO : errno, std::memory_order_relaxed);
    return false;
  }
  return true;
}

void Log::WriteDirect(std::string_view line) {
  if (file_state_.load(std::memory_order_acquire) == kWriting) WriteLine(line);
}

bool Log::has_file() const { return file_state_.load(std::memory_order_acquire) == kWriting; }

std::string Log::failure() const {
  const int e = failed_errno_.load(std::memory_order_relaxed);
  return e == 0 ? std::string() : std::string(strerror(e));
}

}  // namespace lazypin
