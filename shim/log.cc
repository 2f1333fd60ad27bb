// log: the asynchronous JSON Lines writer (see log.h).
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <chrono>
#include <mutex>


#include "fmt/format.h"
#include "spdlog/async.h"
#include "spdlog/async_logger.h"
#include "spdlog/details/null_mutex.h"
#include "spdlog/sinks/base_sink.h"
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

// The one sink: each record straight to the file descriptor, unbuffered, so
// that whatever the writer thread has dequeued is on disk if the process dies.
class FdSink final : public spdlog::sinks::base_sink<spdlog::details::null_mutex> {
 public:
  explicit FdSink(Log* log) : log_(log) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (log_->failed_errno_.load(std::memory_order_relaxed) == 0) {
      line_.assign(msg.payload.data(), msg.payload.size());
      line_.push_back('\n');
      if (!WriteAll(log_->fd_, line_.data(), line_.size(), &log_->offset_, log_->size_limit_)) {
        log_->failed_errno_.store(errno == 0 ? EIO : errno, std::memory_order_relaxed);
      }
    }
    log_->written_.fetch_add(1, std::memory_order_release);
  }
  void flush_() override {}

 private:
  Log* const log_;
  std::string line_;
};

std::unique_ptr<Log> Log::Open(const std::string& path, std::string* error) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST) {
    // Reuse an existing file only if it is a plain file of ours, and not a link.
    fd = ::open(path.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid())) {
      ::close(fd);
      *error = fmt::format("lazypin: LAZYPIN_LOG={} is not a regular file owned by this user; "
                           "not writing a log file", path);
      return nullptr;
    }
    if (fd >= 0 && ftruncate(fd, 0) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  if (fd < 0) {
    *error = fmt::format("lazypin: cannot open log file {}: {}{}; not writing a log file "
                         "(LAZYPIN_LOG accepts a writable path)", path, strerror(errno),
                         errno == ELOOP ? " (it is a symbolic link)" : "");
    return nullptr;
  }
  return std::unique_ptr<Log>(new Log(fd, path));
}

Log::Log(int fd, std::string path) : fd_(fd), path_(std::move(path)) {
  struct rlimit limit;
  if (getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    size_limit_ = limit.rlim_cur;
  }
  // The writer thread must never run the program's signal handlers, and must
  // not be killed by SIGXFSZ when the file hits RLIMIT_FSIZE (write fails instead).
  pool_ = std::make_shared<spdlog::details::thread_pool>(8192, 1, [] {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, nullptr);
  });
  auto sink = std::make_shared<FdSink>(this);
  sink->set_pattern("%v");
  logger_ = std::make_shared<spdlog::async_logger>("lazypin", std::move(sink), pool_,
                                                   spdlog::async_overflow_policy::block);
  logger_->set_level(spdlog::level::info);
  flusher_ = StartThreadWithSignalsBlocked([this] {
    std::unique_lock<std::mutex> lock(flusher_mu_);
    while (!flusher_wake_.wait_for(lock, std::chrono::milliseconds(10),
                                   [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_flusher_; })) {
      lock.unlock();
      Flush();
      lock.lock();
    }
  });
}

void Log::Write(std::string_view line) {
  if (closed_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(batch_mu_);
  if (closed_.load(std::memory_order_relaxed)) return;  // Close() took the lock first
  if (batch_.capacity() == 0) batch_.reserve(1 << 16);
  batch_.append(line.data(), line.size());
  batch_.push_back('\n');
}

void Log::Flush() {
  std::string chunk;
  {
    std::lock_guard<std::mutex> lock(batch_mu_);
    if (batch_.empty()) return;
    chunk.reserve(1 << 16);
    chunk.swap(batch_);
  }
  chunk.pop_back();  // the sink ends every message with a newline
  queued_.fetch_add(1, std::memory_order_relaxed);
  logger_->info(spdlog::string_view_t(chunk.data(), chunk.size()));
}

void Log::Close(std::string_view last_line) {
  // Drain, but keep the writer objects alive: other threads may still be in
  // Write() while the process exits, and the thread dies with the process.
  {
    // Under the batch's lock, so that no other thread's record follows the last line.
    std::lock_guard<std::mutex> lock(batch_mu_);
    if (closed_.exchange(true)) return;
    batch_.append(last_line.data(), last_line.size());
    if (!last_line.empty()) batch_.push_back('\n');
  }
  {
    std::lock_guard<std::mutex> lock(flusher_mu_);
    stop_flusher_ = true;
  }
  flusher_wake_.notify_all();
  if (flusher_.joinable()) flusher_.join();
  Flush();
  WaitDrained(5000);
}

void Log::DrainFromSignal(int timeout_ms) {
  WaitDrained(timeout_ms);
  // Only if no thread was interrupted while adding to the batch.
  if (batch_mu_.try_lock()) {
    if (!batch_.empty()) {
      batch_.pop_back();
      WriteDirect(batch_);
      batch_.clear();
    }
    batch_mu_.unlock();
  }
}

void Log::WaitDrained(int timeout_ms) const {
  for (int i = 0; i < timeout_ms; ++i) {
    if (written_.load(std::memory_order_acquire) >= queued_.load(std::memory_order_relaxed)) return;
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, nullptr);
  }
}

void Log::WriteDirect(std::string_view line) {
  if (failed_errno_.load(std::memory_order_relaxed) != 0) return;
  if (!WriteAll(fd_, line.data(), line.size(), &offset_, size_limit_) ||
      !WriteAll(fd_, "\n", 1, &offset_, size_limit_)) {
    failed_errno_.store(errno == 0 ? EIO : errno, std::memory_order_relaxed);
  }
}

std::string Log::failure() const {
  const int e = failed_errno_.load(std::memory_order_relaxed);
  return e == 0 ? std::string() : std::string(strerror(e));
}

}  // namespace lazypin
