// shim: wiring and lifecycle (see shim.h).
#include "shim.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collector.h"
#include "config.h"
#include "cuda.h"
#include "cuda_pool_driver.h"
#include "dispatch.h"
#include "fmt/format.h"
#include "hooks_memory.h"
#include "log.h"
#include "memory_guard.h"
#include "pfn.h"
#include "pool.h"
#include "real.h"
#include "records.h"
#include "state.h"
#include "stats.h"
#include "thread_state.h"

extern char** environ;

namespace lazypin {

const ShimState* g_state = nullptr;

namespace {

constexpr const char* kVersion = "0.1.0";

thread_local int t_tid LAZYPIN_TLS = 0;

int ThreadId() {
  if (t_tid == 0) t_tid = static_cast<int>(syscall(SYS_gettid));
  return t_tid;
}

int64_t UnixNs() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

std::string ReadSmallFile(const char* path) {
  std::string out;
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0 && out.size() < (1 << 20)) out.append(buf, n);
  close(fd);
  return out;
}

void Publish(const ShimState* state) { __atomic_store_n(&g_state, state, __ATOMIC_RELEASE); }


class Shim;
Shim* g_shim = nullptr;  // set once, before Init() publishes the first state

void ExitHandler();
void ForkChildHandler();
void SignalHandler(int sig);

// Everything lazypin set up in this process. Never destroyed: hooks may run
// until the very end.
class Shim final : public DispatchEnv, public PoolObserver {
 public:
  void Init();
  void AtExit();
  void OnSignal(int sig);
  void InForkChild();

  // DispatchEnv
  int64_t NowNs() override { return MonotonicNs(); }
  Context CurrentContext() override {
    CUcontext ctx = nullptr;
    if (auto get = ctx_get_current_.Get(&real::Driver, "cuCtxGetCurrent")) get(&ctx);
    return ctx;
  }
  int CurrentDevice() override {
    CUdevice device = -1;
    auto get = ctx_get_device_.Get(&real::Driver, "cuCtxGetDevice");
    if (get == nullptr || get(&device) != CUDA_SUCCESS) device = -1;
    return device;
  }
  void Record(const CallRecord& record) override;

  // PoolObserver
  void OnEvict(uintptr_t ptr, size_t bytes, EvictReason reason, int result,
               int64_t latency_ns) override;
  void OnWarning(const std::string& message) override;

 private:
  int64_t SinceStart() const { return MonotonicNs() - start_mono_ns_; }
  std::string HeaderLine(const std::string& log_path);
  void InstallExitHandlerOnce();

  Config config_;
  int64_t start_mono_ns_ = 0;
  int64_t start_unix_ns_ = 0;
  std::unique_ptr<Log> log_;
  Stats stats_;
  std::unique_ptr<PoolDriver> pool_driver_;
  std::unique_ptr<Pool> pool_;
  std::unique_ptr<Collector> collector_;
  std::unique_ptr<Dispatch> dispatch_;
  std::unique_ptr<MemoryGuard> guard_;
  Mode effective_ = Mode::kOff;
  std::string why_;  // why the effective mode differs from the requested one
  std::vector<std::string> warnings_;  // the configuration's, for the log's first lines
  bool in_fork_child_ = false;
  const ShimState* state_ = nullptr;
  std::atomic<bool> exit_handler_installed_{false};
  real::Lazy<CUresult (*)(CUcontext*)> ctx_get_current_;
  real::Lazy<CUresult (*)(CUdevice*)> ctx_get_device_;
  real::Lazy<CUresult (*)(int*)> driver_get_version_;
  struct sigaction old_action_[NSIG] = {};
};

// Set-up, inside the program's first call: parse the configuration, build the
// call path (and, deferring, the pool and its collector thread), publish it,
// and start the log's writer thread, which creates the file and writes the
// header while the program goes on (records are kept in memory until then).
void Shim::Init() {
  start_mono_ns_ = MonotonicNs();
  start_unix_ns_ = UnixNs();
  const uint64_t ram = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                       static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  ParsedConfig parsed = ParseConfig([](const char* name) { return getenv(name); }, ram, environ);
  config_ = parsed.config;
  warnings_ = std::move(parsed.errors);
  for (const std::string& warning : warnings_) fprintf(stderr, "%s\n", warning.c_str());
  if (config_.mode == Mode::kOff) {
    static const ShimState off{Mode::kOff, Mode::kOff, "", nullptr, nullptr};
    state_ = &off;
    Publish(state_);
    return;
  }

  effective_ = config_.mode;
  if (effective_ == Mode::kDefer) {
    std::string failed;
    if (!MemoryHooksSelfTest(&failed)) {
      effective_ = Mode::kLog;
      why_ = fmt::format("the memory hooks' self-test failed ({})", failed);
      warnings_.push_back(fmt::format("lazypin: LAZYPIN_MODE=defer turned off, logging only: {}", why_));
      fprintf(stderr, "%s\n", warnings_.back().c_str());
    }
  }
  const std::string pattern = config_.log_path.empty()
                                  ? DefaultLogPattern(program_invocation_short_name)
                                  : config_.log_path;
  log_ = Log::Deferred(ExpandLogPath(pattern, getpid()));
  if (effective_ == Mode::kDefer) {
    PoolLimits limits;
    limits.max_bytes = config_.pool_bytes;
    limits.max_entries = config_.pool_entries;
    limits.check_frames = config_.check_pfn;
    pool_driver_ = MakeCudaPoolDriver();
    pool_ = std::make_unique<Pool>(pool_driver_.get(), this, limits);
    // Before anything is pooled: a free of pooled memory from a signal handler
    // that interrupted the driver must never unregister on its own thread.
    collector_ = std::make_unique<Collector>(pool_.get(), config_.idle_ms, &RealFree);
    guard_ = std::make_unique<MemoryGuard>(pool_.get(), collector_.get());
  }
  dispatch_ = std::make_unique<Dispatch>(this, pool_.get());
  pthread_atfork(nullptr, nullptr, ForkChildHandler);
  for (int sig : {SIGTERM, SIGINT}) {
    struct sigaction old;
    if (sigaction(sig, nullptr, &old) == 0 && !(old.sa_flags & SA_SIGINFO) &&
        old.sa_handler == SIG_DFL) {
      struct sigaction action = {};
      action.sa_handler = SignalHandler;
      sigemptyset(&action.sa_mask);
      action.sa_flags = SA_RESTART;
      old_action_[sig] = old;
      sigaction(sig, &action, nullptr);
    }
  }
  state_ = new ShimState{config_.mode, effective_, why_.c_str(), dispatch_.get(), guard_.get()};
  Publish(state_);
  const bool started = log_->Start([this](const std::string& path) {
    ScopedInsideLazypin inside_writer;
    std::vector<std::string> lines{HeaderLine(path)};
    for (const std::string& warning : warnings_) lines.push_back(WarningRecordLine(0, warning));
    return lines;
  });
  if (!started) {
    fprintf(stderr, "lazypin: cannot start the log's writer thread; not writing a log file\n");
  }
  if (pool_ != nullptr && config_.check_pfn) {
    std::vector<uint64_t> frames;
    if (!ReadPageFrames(reinterpret_cast<uintptr_t>(&frames), 1, &frames)) {
      OnWarning("LAZYPIN_CHECK_PFN=1 needs root (CAP_SYS_ADMIN) to read /proc/self/pagemap; "
                "page checks are off");
    }
  }
}

std::string Shim::HeaderLine(const std::string& log_path) {
  HeaderInfo info;
  info.version = kVersion;
  info.pid = getpid();
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  info.exe.assign(exe, n > 0 ? static_cast<size_t>(n) : 0);
  info.cmdline = ReadSmallFile("/proc/self/cmdline");
  info.requested = config_.mode;
  info.effective = effective_;
  info.why_effective = why_;
  info.start_unix_ns = start_unix_ns_;
  info.driver_version = 0;
  if (auto get_version = driver_get_version_.Get(&real::Driver, "cuDriverGetVersion")) {
    if (get_version(&info.driver_version) != CUDA_SUCCESS) info.driver_version = 0;
  }
  info.config = &config_;
  info.log_path = log_path;
  return HeaderRecord(info);
}

void Shim::InstallExitHandlerOnce() {
  // After the first real call, so that cudart (set up inside that call)
  // registered its own exit handler first, and ours runs while CUDA is alive.
  if (exit_handler_installed_.load(std::memory_order_relaxed) ||
      exit_handler_installed_.exchange(true)) {
    return;
  }
  atexit(ExitHandler);
}

void Shim::Record(const CallRecord& record) {
  stats_.RecordCall(record.call.api, record.call.bytes, record.result, record.latency_ns,
                    record.action);
  if (log_) log_->Write(CallRecordLine(SinceStart(), ThreadId(), record).view());
  InstallExitHandlerOnce();
}

void Shim::OnEvict(uintptr_t ptr, size_t bytes, EvictReason reason, int result,
                   int64_t latency_ns) {
  stats_.RecordEvict(latency_ns);
  if (log_) {
    log_->Write(
        EvictRecordLine(SinceStart(), ThreadId(), ptr, bytes, reason, result, latency_ns).view());
  }
}

void Shim::OnWarning(const std::string& message) {
  fprintf(stderr, "lazypin: %s\n", message.c_str());
  if (log_) log_->Write(WarningRecordLine(SinceStart(), message));
}

void Shim::AtExit() {
  static std::atomic<bool> done{false};
  // A fork's child has none of lazypin's threads, and the log is the parent's.
  if (in_fork_child_ || done.exchange(true)) return;
  ScopedInsideLazypin inside;
  // From here on a free of pooled memory invalidates on the freeing thread:
  // the collector stops.
  if (pool_) {
    static const MemoryGuard exit_guard(pool_.get(), nullptr);
    Publish(new ShimState{state_->requested, state_->effective, state_->why, dispatch_.get(),
                          &exit_guard});
  }
  if (collector_) collector_->Stop();
  if (pool_ && config_.release_at_exit) pool_->ReleaseAll(EvictReason::kExit);
  const PoolCounters counters = pool_ ? pool_->Counters() : PoolCounters{};
  std::string log_note;
  if (log_) {
    log_->Close(stats_.SummaryJson(counters, SinceStart(), "exit"));
    // No file: the writer said why on stderr when it could not create it.
    const std::string failure = log_->failure();
    if (log_->has_file()) {
      log_note = failure.empty()
                     ? fmt::format("lazypin: log: {}\n", log_->path())
                     : fmt::format("lazypin: log {} is incomplete: {}\n", log_->path(), failure);
    }
  }
  if (config_.summary) {
    const std::string text = stats_.SummaryText(counters, pool_ != nullptr) + log_note;
    fputs(text.c_str(), stderr);
  } else if (!log_note.empty() && log_note.find("incomplete") != std::string::npos) {
    fputs(log_note.c_str(), stderr);
  }
  // The pool stays: exit handlers and static destructors that run after this
  // one may still free, unmap or register pooled memory (records are dropped
  // from now on). The driver's teardown releases what is left.
}

void Shim::OnSignal(int sig) {
  // Async-signal-safe only: wait for the writer thread, append a short
  // summary by hand, then die of the signal as the program would have. In a
  // fork's child, or once dying, only the latter: the log is the parent's.
  const ShimState* state = PublishedState();
  if (log_ && state != nullptr && state->dispatch != nullptr) {
    log_->DrainFromSignal(500);
    char line[160];
    const size_t len =
        SignalSummaryLine(line, sizeof line, SinceStart(), sig == SIGTERM ? "SIGTERM" : "SIGINT");
    log_->WriteDirect(std::string_view(line, len));
  }
  static const ShimState dying{Mode::kOff, Mode::kOff, "a fatal signal", nullptr, nullptr};
  Publish(&dying);
  sigaction(sig, &old_action_[sig], nullptr);
  raise(sig);
}

void Shim::InForkChild() {
  // The child has one thread and none of ours: forget the pool without a
  // driver call or a lock, leave the parent's log alone, pass everything through.
  in_fork_child_ = true;
  if (pool_) pool_->AbandonAfterFork();
  static const ShimState child{Mode::kOff, Mode::kOff, "a fork's child", nullptr, nullptr};
  Publish(&child);
  // Signals do in the child exactly what they do without lazypin.
  for (int sig : {SIGTERM, SIGINT}) {
    struct sigaction now;
    if (sigaction(sig, nullptr, &now) == 0 && !(now.sa_flags & SA_SIGINFO) &&
        now.sa_handler == SignalHandler) {
      sigaction(sig, &old_action_[sig], nullptr);
    }
  }
}

void ExitHandler() {
  if (PublishedState() != nullptr && g_shim != nullptr) g_shim->AtExit();
}
void ForkChildHandler() {
  if (g_shim != nullptr) g_shim->InForkChild();
}
void SignalHandler(int sig) {
  const int saved_errno = errno;
  if (g_shim != nullptr) g_shim->OnSignal(sig);
  errno = saved_errno;
}

}  // namespace

const ShimState* ActiveState() {
  static std::once_flag once;
  if (PublishedState() == nullptr) {
    std::call_once(once, [] {
      ScopedInsideLazypin inside;
      g_shim = new Shim();  // never destroyed: hooks may run until the very end
      g_shim->Init();       // publishes the state
    });
  }
  return PublishedState();
}

}  // namespace lazypin
