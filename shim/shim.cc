// shim: wiring and lifecycle (see shim.h).
#include "shim.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "callsite.h"
#include "auto_pin.h"
#include "capture.h"
#include "collector.h"
#include "config.h"
#include "cuda.h"
#include "cuda_pool_driver.h"
#include "dispatch.h"
#include "fmt/format.h"
#include "hooks_alloc.h"
#include "hooks_memory.h"
#include "host_alloc_cache.h"
#include "log.h"
#include "mem_watch.h"
#include "memory_guard.h"
#include "nvtx.h"
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
void ForkPrepareHandler();
void ForkParentHandler();
void ForkChildHandler();
void SignalHandler(int sig);
bool LeftSetUpProcess();

// Everything lazypin set up in this process. Never destroyed: hooks may run
// until the very end.
class Shim final : public DispatchEnv, public PoolObserver, public HostAllocObserver,
                   public AutoPinSink {
 public:
  void Init();
  void AtExit();
  void OnSignal(int sig);
  void BeforeFork();
  void AfterForkInParent();
  void InForkChild();
  // True in a process that got a copy of this one's memory without fork's
  // handlers (a raw clone or clone3 without CLONE_VM) and so runs none of
  // lazypin's threads: see MarkProcess. Async-signal-safe.
  bool InCopiedProcess() const {
    if (process_mark_ != nullptr) return __atomic_load_n(process_mark_, __ATOMIC_RELAXED) == 0;
    return getpid() != pid_;
  }
  const ShimState* state() const { return state_; }

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
  bool CaptureForbidsDeferral() override {
    if (!Captures().Any()) return false;
    auto exchange = capture_mode_.Get(&real::Driver, "cuThreadExchangeStreamCaptureMode");
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    // Unknown: forward (the driver's own answer is always the bare one).
    if (exchange == nullptr || exchange(&mode) != CUDA_SUCCESS) return true;
    CUstreamCaptureMode restore = mode;
    exchange(&restore);
    return Captures().ForbidsUnsafeCall(CaptureThreadId(), static_cast<CaptureMode>(mode));
  }
  void CallStarts(const ProgramCall& call) override { nvtx::CallBegins(call.api); }
  void Record(const CallRecord& record) override;
  int WaitForDevice(Context ctx) override {
    // A synchronize would invalidate a capture in progress in the context,
    // even in relaxed mode: then no wait, and the unregister is forwarded.
    if (Captures().InProgress(ctx)) return kCudaCaptureUnsupported;
    // `ctx` is current on this thread: cuCtxSynchronize waits for it alone.
    auto synchronize = ctx_synchronize_.Get(&real::Driver, "cuCtxSynchronize");
    return synchronize != nullptr ? int{synchronize()} : kCudaNotInitialized;
  }
  bool PrimaryContextActive(int device) override {
    auto get_state = primary_get_state_.Get(&real::Driver, "cuDevicePrimaryCtxGetState");
    unsigned flags = 0;
    int active = 0;
    return get_state != nullptr && get_state(device, &flags, &active) == CUDA_SUCCESS && active != 0;
  }
  void SynchronizeStream(void* stream) override {
    auto is_capturing = stream_is_capturing_.Get(&real::Driver, "cuStreamIsCapturing");
    auto synchronize = stream_synchronize_.Get(&real::Driver, "cuStreamSynchronize");
    if (is_capturing == nullptr || synchronize == nullptr) return;
    // A capturing stream ran nothing (the copy was recorded), and synchronizing
    // it would invalidate the capture: leave it, as for an unknown status.
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
    const CUstream s = static_cast<CUstream>(stream);
    if (is_capturing(s, &status) != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE) return;
    synchronize(s);
  }

  // PoolObserver
  void OnEvict(uintptr_t ptr, size_t bytes, EvictReason reason, int result, int64_t latency_ns,
               const ReleaseWait& wait) override;
  void OnWarning(const std::string& message) override;

  // HostAllocObserver
  void OnHostRelease(uintptr_t ptr, size_t bytes, EvictReason reason, int result,
                     int64_t latency_ns, const ReleaseWait& wait) override;

  // AutoPinSink
  void RecordAutoPin(const AutoPinRecord& record) override;
  void OnFirstCopy() override { InstallHandlersOnce(); }

 private:
  int64_t SinceStart() const { return MonotonicNs() - start_mono_ns_; }
  std::string HeaderLine(const std::string& log_path);
  // The log's Formatter (on its writer thread): counts the record in the
  // statistics, then formats it.
  void FormatEntry(const LogEntry& entry, std::string* line);
  // Opens the kernel watch as LAZYPIN_WATCH asks; false when it is required and cannot be had.
  bool OpenWatch();
  void InstallHandlersOnce();
  void MarkProcess();

  Config config_;
  int64_t start_mono_ns_ = 0;
  int64_t start_unix_ns_ = 0;
  std::unique_ptr<Log> log_;
  // The stack of a record: 0 (none) unless LAZYPIN_STACKS asks for it here.
  // A program call's stack. `what`, `ptr` and `bytes` name the call's shape:
  // with LAZYPIN_STACKS=1 each shape is unwound once (CallSites::CaptureOnce).
  int StackOf(Action action, uint64_t what, uintptr_t ptr, size_t bytes);
  std::unique_ptr<CallSites> sites_;  // with a log and LAZYPIN_STACKS on
  Stats stats_;
  std::unique_ptr<MemWatch> watch_;
  std::string watch_reason_;  // why the kernel watch is not on
  std::unique_ptr<PoolDriver> pool_driver_;
  std::unique_ptr<Pool> pool_;
  std::unique_ptr<HostAllocDriver> host_driver_;
  std::unique_ptr<HostAllocCache> host_cache_;  // defer mode with LAZYPIN_HOST_ALLOC_CACHE > 0
  std::unique_ptr<Collector> collector_;
  std::unique_ptr<Dispatch> dispatch_;
  std::unique_ptr<MemoryGuard> guard_;
  std::unique_ptr<AutoPin> auto_pin_;
  Mode effective_ = Mode::kOff;
  std::string why_;  // why the effective mode differs from the requested one
  std::vector<std::string> warnings_;  // set-up's, for the log's first lines; fixed after Init
  // Those of warnings_ that stderr gets with the first call lazypin records
  // (InstallHandlersOnce), not at set-up: a CUDA program that never makes one
  // hears nothing of what lazypin would have done (configuration errors are
  // said at once).
  std::vector<std::string> said_at_first_call_;
  const ShimState* state_ = nullptr;
  std::atomic<bool> handlers_installed_{false};
  real::Lazy<CUresult (*)(CUcontext*)> ctx_get_current_;
  real::Lazy<CUresult (*)(CUdevice*)> ctx_get_device_;
  real::Lazy<CUresult (*)(int*)> driver_get_version_;
  real::Lazy<CUresult (*)()> ctx_synchronize_;
  real::Lazy<CUresult (*)(CUdevice, unsigned*, int*)> primary_get_state_;
  real::Lazy<CUresult (*)(CUstream, CUstreamCaptureStatus*)> stream_is_capturing_;
  real::Lazy<CUresult (*)(CUstream)> stream_synchronize_;
  real::Lazy<CUresult (*)(CUstreamCaptureMode*)> capture_mode_;
  struct sigaction old_action_[NSIG] = {};
  pid_t pid_ = 0;                       // the process that set lazypin up
  const uint32_t* process_mark_ = nullptr;  // nonzero here, zero in a copy (MarkProcess)
  bool in_child_ = false;               // InForkChild ran: nothing here is this process's
};

void Shim::MarkProcess() {
  // A page the kernel hands zeroed to a child with its own copy of the memory
  // (fork, clone without CLONE_VM: MADV_WIPEONFORK, Linux 4.14), and shares
  // unchanged with a child that shares the memory (vfork, posix_spawn's
  // CLONE_VM child, a thread): one load tells this process from a copy, and a
  // CLONE_VM child never switches its parent's state. Without it, the pid
  // recorded here (a syscall per check; a CLONE_VM child that calls into
  // lazypin between its clone and its exec then counts as a copy).
  pid_ = getpid();
  void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) return;
  if (madvise(page, 4096, MADV_WIPEONFORK) != 0) {
    munmap(page, 4096);
    return;
  }
  *static_cast<uint32_t*>(page) = 1;
  process_mark_ = static_cast<const uint32_t*>(page);
}

namespace {

// `path`'s first line as a number of bytes; 0 when unreadable or "max".
uint64_t ReadLimit(const char* path) {
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[64];
  const ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return 0;
  uint64_t v = 0;
  for (ssize_t i = 0; i < n && buf[i] >= '0' && buf[i] <= '9'; ++i) v = v * 10 + (buf[i] - '0');
  return v;
}

}  // namespace

// What "N% of RAM" means: the machine's memory, or the memory limit of this
// process's cgroup (v2 memory.max, v1 memory.limit_in_bytes) when lower, so
// that pinned memory kept for later never pushes a container past its limit.
uint64_t MemoryForPercentages() {
  const uint64_t ram = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                       static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  char text[2048];
  const int fd = open("/proc/self/cgroup", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ram;
  const ssize_t n = read(fd, text, sizeof(text) - 1);
  close(fd);
  if (n <= 0) return ram;
  text[n] = '\0';
  // One line per hierarchy, "id:controllers:/path": the v1 memory
  // controller's if there is one (hybrid set-ups), else v2's "0::/path".
  char path[640] = "";
  for (char* line = text; line != nullptr && *line != '\0';) {
    char* next = strchr(line, '\n');
    if (next != nullptr) *next++ = '\0';
    const char* colon = strchr(line, ':');
    if (colon != nullptr) {
      const char* controllers = colon + 1;
      const char* rest = strchr(controllers, ':');
      if (rest != nullptr && strncmp(controllers, "memory:", 7) == 0) {
        snprintf(path, sizeof(path), "/sys/fs/cgroup/memory%s/memory.limit_in_bytes", rest + 1);
        break;
      }
      if (rest != nullptr && rest == controllers && line[0] == '0') {
        snprintf(path, sizeof(path), "/sys/fs/cgroup%s/memory.max", rest + 1);
      }
    }
    line = next;
  }
  const uint64_t limit = path[0] != '\0' ? ReadLimit(path) : 0;
  return limit != 0 && limit < ram ? limit : ram;
}

// Set-up (ActiveState says when): parse the configuration, build the call
// path (and, deferring, the pool and its collector thread), look up what the
// first call would (the call sites' objects and tables), publish
// it, and start the log's writer thread, which creates the file and writes
// the header once the first record is there (records are kept in memory until then).
void Shim::Init() {
  MarkProcess();
  start_mono_ns_ = MonotonicNs();
  start_unix_ns_ = UnixNs();
  const uint64_t ram = MemoryForPercentages();
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
      why_ = fmt::format("the memory hooks' self-test failed ({})", failed);
    } else if (!OpenWatch()) {
      why_ = fmt::format("LAZYPIN_WATCH=kernel and the kernel watch is not available ({})",
                         watch_reason_);
    }
    if (!why_.empty()) {
      effective_ = Mode::kLog;
      warnings_.push_back(fmt::format("lazypin: LAZYPIN_MODE=defer turned off, logging only: {}", why_));
      said_at_first_call_.push_back(warnings_.back());
    } else if (!watch_reason_.empty() && config_.watch == WatchMode::kAuto) {
      warnings_.push_back(fmt::format(
          "lazypin: the kernel watch is not available ({}); deferring with the hooks alone, which "
          "miss raw system calls and glibc's own unmaps (LAZYPIN_WATCH=hooks says so quietly)",
          watch_reason_));
      said_at_first_call_.push_back(warnings_.back());
    }
  }
  const std::string pattern = config_.log_path.empty()
                                  ? DefaultLogPattern(program_invocation_short_name)
                                  : config_.log_path;
  log_ = Log::Deferred(ExpandLogPath(pattern, getpid()),
                       [this](const LogEntry& entry, std::string* line) { FormatEntry(entry, line); });
  if (config_.stacks != StackMode::kOff) {
    sites_ = std::make_unique<CallSites>(reinterpret_cast<const void*>(&ExitHandler));
  }
  if (effective_ == Mode::kDefer) {
    PoolLimits limits;
    limits.max_bytes = config_.pool_bytes;
    limits.max_entries = config_.pool_entries;
    limits.check_frames = config_.check_pfn;
    pool_driver_ = MakeCudaPoolDriver(watch_.get(), config_.defer_shared, config_.prefault_threads);
    pool_ = std::make_unique<Pool>(pool_driver_.get(), this, limits);
    if (config_.host_alloc_bytes > 0) {
      HostAllocLimits host_limits;
      host_limits.max_bytes = config_.host_alloc_bytes;
      host_limits.max_entries = config_.pool_entries;
      host_driver_ = MakeCudaHostAllocDriver();
      host_cache_ = std::make_unique<HostAllocCache>(host_driver_.get(), this, host_limits);
    }
    bool reuse = false;
    if (config_.reuse_freed != 0) {
      std::string why_not;
      reuse = AllocatorReuseCheck(&why_not);
      if (reuse) {
        pool_->EnableReuse(ReuseHooks{&RealFree, &g_parked_blocks, config_.reuse_freed});
      } else {  // said once, in the log: the program runs as with LAZYPIN_REUSE_FREED=0
        warnings_.push_back(fmt::format(
            "lazypin: LAZYPIN_REUSE_FREED steps aside: {}; freed blocks are unregistered and freed",
            why_not));
      }
    }
    collector_ = std::make_unique<Collector>(pool_.get(), config_.idle_ms, &RealFree, FreeBounds{},
                                             &Captures(), host_cache_.get());
    guard_ = std::make_unique<MemoryGuard>(pool_.get(), collector_.get(), &LeftSetUpProcess,
                                           host_cache_.get(), reuse);
  }
  dispatch_ = std::make_unique<Dispatch>(this, pool_.get(), config_.unregister_wait,
                                         host_cache_.get());
  if (config_.autopin) {
    // Auto-pinned memory is pageable to the program: every change of its
    // pages must be seen, raw system calls too, so the kernel watch is required.
    std::string why_not;
    if (pool_ == nullptr) {
      why_not = "it needs LAZYPIN_MODE=defer";
    } else if (watch_ == nullptr) {
      why_not = fmt::format("it needs the kernel watch ({})", watch_reason_);
    }
    if (!why_not.empty()) {
      warnings_.push_back(fmt::format("lazypin: LAZYPIN_AUTOPIN=1 ignored: {}", why_not));
      said_at_first_call_.push_back(warnings_.back());
    } else {
      auto_pin_ = std::make_unique<AutoPin>(
          pool_.get(), this, this, AutoPinLimits{config_.autopin_min, config_.autopin_bytes,
                                      static_cast<int>(config_.autopin_after)});
    }
  }
  if (pool_ != nullptr && config_.check_pfn) {
    std::vector<uint64_t> frames;
    if (!ReadPageFrames(reinterpret_cast<uintptr_t>(&frames), 1, &frames)) {
      warnings_.push_back("lazypin: LAZYPIN_CHECK_PFN=1 needs root (CAP_SYS_ADMIN) to read "
                          "/proc/self/pagemap; page checks are off");
      said_at_first_call_.push_back(warnings_.back());
    }
  }
  state_ = new ShimState{config_.mode, effective_, why_.c_str(), dispatch_.get(), guard_.get(),
                         auto_pin_.get()};
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
}

bool Shim::OpenWatch() {
  if (config_.watch == WatchMode::kHooks) {
    watch_reason_ = "LAZYPIN_WATCH=hooks";
    return true;
  }
  watch_ = MemWatch::Open(&watch_reason_);
  return watch_ != nullptr || config_.watch == WatchMode::kAuto;
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
  info.host = ShortHostName();
  info.watch = watch_ != nullptr ? "uffd" : "hooks";
  info.watch_reason = effective_ == Mode::kDefer ? watch_reason_ : "";
  info.start_unix_ns = start_unix_ns_;
  info.driver_version = 0;
  if (auto get_version = driver_get_version_.Get(&real::Driver, "cuDriverGetVersion")) {
    if (get_version(&info.driver_version) != CUDA_SUCCESS) info.driver_version = 0;
  }
  info.config = &config_;
  info.log_path = log_path;
  return HeaderRecord(info);
}

void Shim::InstallHandlersOnce() {
  // After the first real call, not at set-up (which may run inside CUDA's
  // own): CUDA registered its exit and fork handlers first, and ours run
  // before them (both run last-registered first), while CUDA is usable; a
  // process that never makes a call keeps its signal dispositions untouched.
  // A fork's child before this is told apart by MarkProcess's page.
  if (handlers_installed_.load(std::memory_order_relaxed) || handlers_installed_.exchange(true)) {
    return;
  }
  for (const std::string& warning : said_at_first_call_) fprintf(stderr, "%s\n", warning.c_str());
  atexit(ExitHandler);
  pthread_atfork(ForkPrepareHandler, ForkParentHandler, ForkChildHandler);
  for (int sig : {SIGTERM, SIGINT}) {  // the log's last records on a fatal signal
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
}

int Shim::StackOf(Action action, uint64_t what, uintptr_t ptr, size_t bytes) {
  if (!sites_ || t_state.own_thread) return 0;
  // LAZYPIN_STACKS=all: every call, unwound each time (key 0). Else the calls
  // that reached the driver only (a hit or a deferral costs about a
  // microsecond, a stack more), each call shape unwound once.
  uint64_t key = 0;
  if (config_.stacks != StackMode::kAll) {
    if (action == Action::kHit || action == Action::kDeferred) return 0;
    key = ((what * 0x9e3779b97f4a7c15u) ^ (ptr * 0xff51afd7ed558ccdu) ^ bytes) | 1;
  }
  return sites_->CaptureOnce(
      key, CallSites::Emit{[this](std::string&& line) { log_->Write(std::move(line)); },
                           [this](int id) {
                             LogEntry entry;
                             entry.kind = LogEntry::Kind::kStack;
                             entry.stack = static_cast<int16_t>(id);
                             log_->Write(entry);
                           }});
}

// The per-call path: 56 bytes into the log's ring; the writer thread counts
// and formats them (FormatEntry).
void Shim::Record(const CallRecord& record) {
  nvtx::CallEnds(record.action, record.reason);
  // A new stack's lines go into the ring first, from this thread: before the record naming it.
  const int stack = StackOf(record.action, static_cast<uint64_t>(record.call.api) << 8 | record.call.flags,
                            reinterpret_cast<uintptr_t>(record.call.ptr), record.call.bytes);
  LogEntry entry;
  entry.kind = LogEntry::Kind::kCall;
  entry.api = static_cast<uint8_t>(record.call.api);
  entry.via = static_cast<uint8_t>(record.call.via);
  entry.action = static_cast<uint8_t>(record.action);
  entry.reason = static_cast<uint8_t>(record.reason);
  entry.result = record.result;
  entry.tid = ThreadId();
  entry.call.flags = record.call.flags;
  entry.call.evicted = record.evicted;
  entry.t_ns = record.end_ns - start_mono_ns_;
  entry.latency_ns = record.latency_ns;
  entry.ptr = reinterpret_cast<uintptr_t>(record.call.ptr);
  entry.bytes = record.call.bytes;
  entry.stack = static_cast<int16_t>(stack);
  log_->Write(entry);
  InstallHandlersOnce();
}

void Shim::OnEvict(uintptr_t ptr, size_t bytes, EvictReason reason, int result, int64_t latency_ns,
                   const ReleaseWait& wait) {
  nvtx::Evicted(reason, wait.forced);
  // No stack: an eviction may run in a memory hook called from a signal
  // handler, where neither the unwinder's table lock nor Python may be taken.
  LogEntry entry;
  entry.kind = LogEntry::Kind::kEvict;
  entry.reason = static_cast<uint8_t>(reason);
  entry.forced = wait.forced;
  entry.result = result;
  entry.tid = ThreadId();
  entry.t_ns = SinceStart();
  entry.latency_ns = latency_ns;
  entry.ptr = ptr;
  entry.bytes = bytes;
  entry.waited_ns = wait.waited_ns;
  entry.stack = 0;
  log_->Write(entry);
}

void Shim::FormatEntry(const LogEntry& e, std::string* line) {
  switch (e.kind) {
    case LogEntry::Kind::kCall: {
      const Api api = static_cast<Api>(e.api);
      const Action action = static_cast<Action>(e.action);
      stats_.RecordCall(api, e.bytes, e.result, e.latency_ns, action);
      const CallRecord record{
          ProgramCall{api, static_cast<Via>(e.via), reinterpret_cast<void*>(e.ptr), e.bytes,
                      e.call.flags},
          e.result, e.latency_ns, action, e.call.evicted, static_cast<PassReason>(e.reason)};
      line->append(CallRecordLine(e.t_ns, e.tid, record, e.stack).view());
      return;
    }
    case LogEntry::Kind::kEvict: {
      stats_.RecordEvict(e.latency_ns);
      ReleaseWait wait;
      wait.waited_ns = e.waited_ns;
      wait.forced = e.forced;
      line->append(EvictRecordLine(e.t_ns, e.tid, e.ptr, e.bytes, static_cast<EvictReason>(e.reason),
                                   e.result, e.latency_ns, wait, e.stack)
                       .view());
      return;
    }
    case LogEntry::Kind::kStack:
      *line = sites_->StackLine(e.stack);
      return;
    case LogEntry::Kind::kDropped:
      *line = WarningRecordLine(
          SinceStart(), fmt::format("{} log records were dropped: the log's ring of {} records "
                                    "stayed full for 50 ms (the writer could not keep up)",
                                    e.bytes, LogRing::kSlots));
      fprintf(stderr, "lazypin: %s log records were dropped (the log could not keep up)\n",
              std::to_string(e.bytes).c_str());
      return;
    case LogEntry::Kind::kText:
      return;  // the log writes those itself
  }
}

void Shim::OnHostRelease(uintptr_t ptr, size_t bytes, EvictReason reason, int result,
                         int64_t latency_ns, const ReleaseWait& wait) {
  if (log_) {
    log_->Write(std::string(
        HostReleaseRecordLine(SinceStart(), ThreadId(), ptr, bytes, reason, result, latency_ns, wait)
            .view()));
  }
}

void Shim::RecordAutoPin(const AutoPinRecord& record) {
  if (record.result != kCudaSuccess) stats_.RecordAutoPinFailure();
  nvtx::AutoPinned(record.result == kCudaSuccess);
  if (log_) log_->Write(std::string(AutoPinRecordLine(SinceStart(), ThreadId(), record).view()));
  InstallHandlersOnce();
}

void Shim::OnWarning(const std::string& message) {
  fprintf(stderr, "lazypin: %s\n", message.c_str());
  if (log_) log_->Write(WarningRecordLine(SinceStart(), message));
}

void Shim::AtExit() {
  // A child's exit: the log, the collector and the pool are its parent's.
  if (in_child_ || LeftSetUpProcess()) return;
  static std::atomic<bool> done{false};
  if (done.exchange(true)) return;
  ScopedInsideLazypin inside;
  // From here on a free of pooled memory invalidates on the freeing thread:
  // the collector stops.
  if (guard_) {
    static const MemoryGuard exit_guard(pool_.get(), nullptr, &LeftSetUpProcess, host_cache_.get());
    Publish(new ShimState{state_->requested, state_->effective, state_->why, dispatch_.get(),
                          &exit_guard});
  }
  if (collector_) collector_->Stop();
  if (pool_ && config_.release_at_exit) pool_->ReleaseAll(EvictReason::kExit);
  if (host_cache_ && config_.release_at_exit) host_cache_->ReleaseAll(EvictReason::kExit);
  const PoolCounters counters = pool_ ? pool_->Counters() : PoolCounters{};
  const HostAllocCounters host_counters = host_cache_ ? host_cache_->Counters() : HostAllocCounters{};
  const HostAllocCounters* host = host_cache_ ? &host_counters : nullptr;
  std::string log_note;
  if (log_) {
    // The summary is made once the writer has counted every record.
    log_->Close([&] { return stats_.SummaryJson(counters, SinceStart(), "exit", host); });
    // No file: the writer said why on stderr when it could not create it.
    const std::string failure = log_->failure();
    if (log_->has_file()) {
      log_note = failure.empty()
                     ? fmt::format("lazypin: log: {}\n", log_->path())
                     : fmt::format("lazypin: log {} is incomplete: {}\n", log_->path(), failure);
    }
  }
  if (config_.summary) {
    const std::string text = stats_.SummaryText(counters, pool_ != nullptr, host) + log_note;
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
  // fork's or clone's child, or once dying, only the latter: the log is the
  // parent's (and its writer thread is not in the child).
  if (LeftSetUpProcess()) {  // restored the disposition: the signal now acts as without lazypin
    raise(sig);
    return;
  }
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

void Shim::BeforeFork() {
  // The kernel copies pinned anonymous pages into the child at fork (a page
  // a device may write cannot be shared copy-on-write), so what the program
  // unregistered and the pool keeps pinned would be copied into every child:
  // release it first. Not from a fork inside lazypin's own code on this
  // thread (a signal handler's fork), which may hold the pool's lock.
  if (!pool_ || t_state.inside > 0) return;
  const ShimState* state = PublishedState();
  if (state == nullptr || state->dispatch == nullptr) return;
  ScopedInsideLazypin inside;
  // The kernel watch's part of these releases waits until the fork is made
  // (it would hold the mmap lock that fork needs).
  if (watch_) watch_->HoldUnwatches(true);
  pool_->ReleaseAll(EvictReason::kFork);
  // Pinned blocks the program freed are not copied into the child either.
  if (host_cache_) host_cache_->ReleaseAll(EvictReason::kFork);
}

void Shim::AfterForkInParent() {
  if (watch_) watch_->HoldUnwatches(false);
}

void Shim::InForkChild() {
  // The child has one thread and none of ours, and any lock of ours may have
  // been held by another thread when it was made: forget the pool without a
  // driver call or a lock, leave the parent's log alone, pass everything
  // through. Async-signal-safe (a clone's child may come here from a signal).
  in_child_ = true;
  if (pool_) pool_->AbandonAfterFork();
  if (host_cache_) host_cache_->AbandonAfterFork();
  if (watch_) watch_->AbandonAfterFork();
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
void ForkPrepareHandler() {
  if (g_shim != nullptr) g_shim->BeforeFork();
}
void ForkParentHandler() {
  if (g_shim != nullptr) g_shim->AfterForkInParent();
}
void ForkChildHandler() {
  if (g_shim != nullptr) g_shim->InForkChild();
}
// In a copy of the set-up process that fork's handlers did not reach (or not
// yet): switches it to what a fork's child does. Async-signal-safe.
bool LeftSetUpProcess() {
  if (g_shim == nullptr || !g_shim->InCopiedProcess()) return false;
  g_shim->InForkChild();
  return true;
}
void SignalHandler(int sig) {
  const int saved_errno = errno;
  if (g_shim != nullptr) g_shim->OnSignal(sig);
  errno = saved_errno;
}

}  // namespace

const ShimState* StateInThisProcess() {
  const ShimState* state = PublishedState();
  if (state != nullptr && state->dispatch != nullptr && LeftSetUpProcess()) state = PublishedState();
  return state;
}

namespace {

std::mutex& SetUpMutex() {
  static std::mutex* const mu = new std::mutex;  // never destroyed
  return *mu;
}
void SetUpLocked() {
  if (PublishedState() != nullptr) return;
  ScopedInsideLazypin inside;
  g_shim = new Shim();  // never destroyed: hooks may run until the very end
  g_shim->Init();       // publishes the state
}

}  // namespace

const ShimState* ActiveState() {
  if (PublishedState() == nullptr) {
    std::lock_guard<std::mutex> lock(SetUpMutex());
    SetUpLocked();
  }
  return StateInThisProcess();
}

bool TrySetUp() {
  if (PublishedState() != nullptr) return true;
  std::unique_lock<std::mutex> lock(SetUpMutex(), std::try_to_lock);
  if (!lock.owns_lock()) return false;
  SetUpLocked();
  return true;
}

}  // namespace lazypin
