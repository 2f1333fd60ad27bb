// log: the asynchronous JSON Lines writer (see log.h).
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>
#include <linux/futex.h>
#include <sched.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <system_error>

#include "fmt/format.h"
#include "descriptors.h"
#include "json.h"
#include "seccomp.h"
#include "sys.h"
#include "thread_state.h"

#if __has_include(<linux/openat2.h>)
#include <linux/openat2.h>
#else
struct open_how {
  uint64_t flags;
  uint64_t mode;
  uint64_t resolve;
};
#define RESOLVE_NO_SYMLINKS 0x04
#endif
#ifndef SYS_openat2
#define SYS_openat2 437  // the same number on every architecture
#endif

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

std::string LogNamePart(std::string_view text) {
  if (text.empty()) return "unknown";
  std::string out(text);
  for (char& c : out) {
    const bool keep = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '_' || c == '-';
    if (!keep) c = '_';
  }
  return out;
}

std::string ShortHostName() {
  struct utsname names;
  if (uname(&names) != 0) return LogNamePart({});
  const std::string_view node(names.nodename);
  return LogNamePart(node.substr(0, node.find('.')));
}


namespace {

// A path as shown in a message: a JSON string of at most its first 80 bytes.
std::string Shown(std::string_view path) {
  constexpr size_t kMax = 80;
  if (path.size() <= kMax) return JsonString(path);
  std::string out = JsonString(path.substr(0, kMax));
  out.insert(out.size() - 1, "...");
  return out;
}

const char* FileKind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a plain file";
}

constexpr const char* kAccepts =
    "LAZYPIN_LOG accepts the path of a new file in a writable directory, without symbolic links";

// The message for a path refused because `link` (a prefix of it) is a link,
// with the same path without links as a suggestion where there is one.
std::string LinkMessage(std::string_view path, std::string_view link, std::string_view dir,
                        std::string_view name) {
  std::string suggestion;
  char resolved[PATH_MAX];
  if (realpath(std::string(dir).c_str(), resolved) != nullptr) {
    std::string candidate = std::string(resolved) + (resolved[1] == '\0' ? "" : "/") + std::string(name);
    struct stat st;
    if (lstat(candidate.c_str(), &st) != 0 || S_ISREG(st.st_mode)) {
      suggestion = fmt::format(", such as {}", Shown(candidate));
    }
  }
  return fmt::format("lazypin: LAZYPIN_LOG={} goes through a symbolic link ({}); lazypin follows "
                     "no link in a log path, so is not writing a log file ({}{})",
                     Shown(path), Shown(link), kAccepts, suggestion);
}

// openat2(2) of a directory, no link followed (magic links included); -1
// with errno ENOSYS on kernels before 5.6.
long OpenAt2NoSymlinks(const char* dir) {
  struct open_how how;
  memset(&how, 0, sizeof(how));
  how.flags = O_PATH | O_DIRECTORY | O_CLOEXEC;
  how.resolve = RESOLVE_NO_SYMLINKS;
  return syscall(SYS_openat2, AT_FDCWD, dir, &how, sizeof(how));
}

// The directory part of `path` ("" for the current directory) as an O_PATH
// descriptor (AT_FDCWD for ""), every component checked not to be a link; or
// -1 and `*message` set.
int OpenDirectory(const std::string& path, std::string_view dir, std::string_view name,
                  LogPathResolver resolver, std::string* message) {
  if (dir.empty()) return AT_FDCWD;
  if (resolver == LogPathResolver::kAuto && !SeccompFiltered()) {  // openat2 may be forbidden
    const long fd = OpenAt2NoSymlinks(std::string(dir).c_str());
    if (fd >= 0) return static_cast<int>(fd);
    // Any failure (no openat2, seccomp's EPERM, a link, a missing directory):
    // the walk gives the answer and names the component at fault.
  }
  int cur = AT_FDCWD;
  size_t pos = 0;
  if (dir[0] == '/') {
    cur = ::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (cur < 0) {
      *message = fmt::format("lazypin: LAZYPIN_LOG={}: cannot open /: {}; not writing a log file",
                             Shown(path), strerror(errno));
      return -1;
    }
  }
  while (pos < dir.size()) {
    size_t stop = dir.find('/', pos);
    if (stop == std::string_view::npos) stop = dir.size();
    const std::string component(dir.substr(pos, stop - pos));
    pos = stop + 1;
    if (component.empty() || component == ".") continue;
    const int next = ::openat(cur, component.c_str(), O_PATH | O_NOFOLLOW | O_DIRECTORY | O_CLOEXEC);
    const int err = errno;
    if (next < 0) {
      struct stat st;
      const std::string_view prefix = dir.substr(0, stop);
      if ((err == ENOTDIR || err == ELOOP) &&
          fstatat(cur, component.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
        *message = LinkMessage(path, prefix, dir, name);
      } else {
        *message = fmt::format("lazypin: LAZYPIN_LOG={}: cannot use directory {}: {}; not "
                               "writing a log file ({})",
                               Shown(path), Shown(prefix), strerror(err), kAccepts);
      }
      if (cur != AT_FDCWD) ::close(cur);
      return -1;
    }
    if (cur != AT_FDCWD) ::close(cur);
    cur = next;
  }
  return cur;
}

// `name` with ".<n>" before its extension ("same.jsonl" -> "same.1.jsonl"),
// or after it when it has none ("log" -> "log.1", ".log" -> ".log.1").
std::string Suffixed(std::string_view name, int n) {
  const size_t dot = name.rfind('.');
  if (dot == std::string_view::npos || dot == 0) return fmt::format("{}.{}", name, n);
  return fmt::format("{}.{}{}", name.substr(0, dot), n, name.substr(dot));
}

// `path` split into its directory part ("" for none) and its name.
struct LogPathParts {
  std::string_view dir;
  std::string name;
};
LogPathParts SplitLogPath(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return {std::string_view(), path};
  return {std::string_view(path).substr(0, slash == 0 ? 1 : slash), path.substr(slash + 1)};
}

std::string NamesADirectoryMessage(const std::string& path) {
  return fmt::format("lazypin: LAZYPIN_LOG={} names a directory, not a file; not writing a log "
                     "file ({})", Shown(path), kAccepts);
}

// The message for a name that exists and is not a regular file (`st`).
std::string NotAFileMessage(const struct stat& st, const std::string& path, std::string_view dir,
                            std::string_view name) {
  if (S_ISLNK(st.st_mode)) return LinkMessage(path, path, dir.empty() ? "." : dir, name);
  return fmt::format("lazypin: LAZYPIN_LOG={} is {}, not a regular file; not writing a log file "
                     "({})", Shown(path), FileKind(st.st_mode), kAccepts);
}

}  // namespace

std::string CheckLogPath(const std::string& path, LogPathResolver resolver) {
  const LogPathParts parts = SplitLogPath(path);
  const std::string& name = parts.name;
  if (name.empty() || name == "." || name == "..") return NamesADirectoryMessage(path);
  std::string message;
  const int dirfd = OpenDirectory(path, parts.dir, name, resolver, &message);
  if (dirfd == -1) return message;
  struct stat st;
  int err = 0;
  if (fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    if (!S_ISREG(st.st_mode)) message = NotAFileMessage(st, path, parts.dir, name);
  } else if (errno != ENOENT) {
    err = errno;  // ENAMETOOLONG, say
  }
  if (message.empty() && err == 0) {
    // An unnamed file in the directory (gone at close) is a create the
    // filesystem itself answers (EROFS, EACCES, EDQUOT...); where it has no
    // O_TMPFILE, the permission check is what is left.
    const int probe = ::openat(dirfd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
    if (probe >= 0) {
      ::close(probe);
    } else if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL) {
      err = errno;
    } else if (faccessat(dirfd, ".", W_OK, AT_EACCESS) != 0) {
      err = errno;
    }
  }
  if (err != 0) {
    message = fmt::format("lazypin: LAZYPIN_LOG={}: cannot create the file: {}; not writing a log "
                          "file ({})", Shown(path), strerror(err), kAccepts);
  }
  if (dirfd != AT_FDCWD) ::close(dirfd);
  return message;
}

CreatedLogFile CreateLogFile(const std::string& path, LogPathResolver resolver) {
  CreatedLogFile out;
  const size_t slash = path.rfind('/');
  const LogPathParts parts = SplitLogPath(path);
  const std::string_view dir = parts.dir;
  const std::string& name = parts.name;
  if (name.empty() || name == "." || name == "..") {
    out.message = NamesADirectoryMessage(path);
    return out;
  }
  const int dirfd = OpenDirectory(path, dir, name, resolver, &out.message);
  if (dirfd == -1) return out;
  constexpr int kFlags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
  constexpr int kMaxSuffix = 1000;
  std::string used = name;
  int fd = ::openat(dirfd, used.c_str(), kFlags, 0600);
  int err = errno;
  if (fd < 0 && err == EEXIST) {
    struct stat st;
    if (fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode)) {
      out.message = NotAFileMessage(st, path, dir, name);
      if (dirfd != AT_FDCWD) ::close(dirfd);
      return out;
    }
    // A regular file (another process's log, or the user's): never touched.
    for (int n = 1; fd < 0 && err == EEXIST && n <= kMaxSuffix; ++n) {
      used = Suffixed(name, n);
      fd = ::openat(dirfd, used.c_str(), kFlags, 0600);
      err = errno;
    }
  }
  if (dirfd != AT_FDCWD) ::close(dirfd);
  const std::string used_path = path.substr(0, slash == std::string::npos ? 0 : slash + 1) + used;
  if (fd < 0) {
    out.message = fmt::format("lazypin: LAZYPIN_LOG={}: cannot create {}: {}; not writing a log "
                              "file ({})", Shown(path), used == name ? "the file" : Shown(used_path),
                              strerror(err), kAccepts);
    return out;
  }
  struct stat st;
  const int flags = fcntl(fd, F_GETFL);
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || flags < 0 ||
      fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    ::close(fd);  // cannot happen for a file this call created; refused all the same
    out.message = fmt::format("lazypin: LAZYPIN_LOG={} did not give a regular file; not writing "
                              "a log file", Shown(used_path));
    return out;
  }
  out.fd = MoveFdHigh(fd);  // out of the program's way (descriptors.h)
  out.dev = st.st_dev;
  out.ino = st.st_ino;
  out.path = used_path;
  if (used != name) {
    out.message = fmt::format("lazypin: LAZYPIN_LOG={} exists (lazypin never overwrites a file); "
                              "this process logs to {}", Shown(path), Shown(used_path));
  }
  return out;
}

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

std::string ExpandLogPattern(std::string_view pattern, const LogNameFields& fields,
                             void (*literal)(char c, std::string* out)) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '%' && i + 1 < pattern.size()) {
      const char what = pattern[i + 1];
      const std::string* field = what == 'p'   ? &fields.pid
                                 : what == 'h' ? &fields.host
                                 : what == 'e' ? &fields.program
                                               : nullptr;
      if (field != nullptr || what == '%') ++i;
      if (field != nullptr) {
        out += *field;
        continue;
      }
    }
    if (literal != nullptr) literal(c, &out);
    else out.push_back(c);
  }
  return out;
}

std::string ExpandLogPath(std::string_view pattern, int pid) {
  return ExpandLogPattern(pattern, {std::to_string(pid), ShortHostName(),
                                    LogNamePart(program_invocation_short_name)});
}

std::string LogPathGlob(std::string_view pattern, int pid) {
  return ExpandLogPattern(
      pattern, {pid == 0 ? "*" : std::to_string(pid), ShortHostName(), "*"},
      [](char c, std::string* out) {
        if (c == '*' || c == '?' || c == '[') *out += fmt::format("[{}]", c);
        else out->push_back(c);
      });
}

}  // namespace lazypin
