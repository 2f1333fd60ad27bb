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
#include <mutex>
#include <optional>

#include "collector.h"
#include "fmt/compile.h"
#include "fmt/format.h"
#include "cuda.h"
#include "hooks_memory.h"
#include "log.h"
#include "pfn.h"
#include "real.h"

namespace lazypin {

Pool* g_active_pool = nullptr;
std::atomic<Collector*> g_collector{nullptr};

namespace {

std::atomic<Shim*> g_shim{nullptr};
// 0: not set up; 1: set up (g_shim may still be null: off, child, exited).
std::atomic<int> g_setup{0};
thread_local int t_tid LAZYPIN_TLS = 0;

constexpr const char* kVersion = "0.1.0";

int64_t MonotonicNs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

int64_t UnixNs() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

int ThreadId() {
  if (t_tid == 0) t_tid = static_cast<int>(syscall(SYS_gettid));
  return t_tid;
}

std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) out += fmt::format("\\u{:04x}", c);
        else out.push_back(static_cast<char>(c));
    }
  }
  out += "\"";
  return out;
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

template <typename Fn>
Fn DriverFn(real::Lazy<Fn>& lazy, const char* name) {
  return lazy.Get(&real::Driver, name);
}

// The pool's route to the real driver: lazypin's own unregisters (evictions).
class RealPoolDriver final : public PoolDriver {
 public:
  int Unregister(uintptr_t ptr, Context ctx) override {
    auto unregister = DriverFn(unregister_, "cuMemHostUnregister");
    auto push = DriverFn(push_, "cuCtxPushCurrent_v2");
    auto pop = DriverFn(pop_, "cuCtxPopCurrent_v2");
    auto capture_mode = DriverFn(capture_mode_, "cuThreadExchangeStreamCaptureMode");
    if (unregister == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    // Not part of any stream capture the program has in progress: in the
    // default (global) mode this thread's unregister would be refused (900)
    // and invalidate another thread's capture (measured on the H200;
    // testapps/capture.cu). Allocators (PyTorch's) do the same.
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    const bool relaxed = capture_mode != nullptr && capture_mode(&mode) == CUDA_SUCCESS;
    // The registration belongs to `ctx`; whichever thread evicts, make it current.
    const bool pushed = ctx != nullptr && push != nullptr && pop != nullptr &&
                        push(static_cast<CUcontext>(ctx)) == CUDA_SUCCESS;
    // No cuCtxSynchronize first, although waiting for the GPU here would spare
    // the other threads the unregister's stall: a synchronize invalidates a
    // capture in progress even in relaxed mode (measured, docs/design.md).
    const int result = unregister(reinterpret_cast<void*>(ptr));
    if (pushed) {
      CUcontext popped;
      pop(&popped);
    }
    if (relaxed) capture_mode(&mode);
    return result;
  }
  bool ReadFrames(uintptr_t ptr, size_t bytes, std::vector<uint64_t>* frames) override {
    return ReadPageFrames(ptr, bytes, frames);
  }
  int64_t NowNs() override { return MonotonicNs(); }

 private:
  real::Lazy<CUresult (*)(void*)> unregister_;
  real::Lazy<CUresult (*)(CUcontext)> push_;
  real::Lazy<CUresult (*)(CUcontext*)> pop_;
  real::Lazy<CUresult (*)(CUstreamCaptureMode*)> capture_mode_;
};

class ShimPoolObserver final : public PoolObserver {
 public:
  explicit ShimPoolObserver(Shim* shim) : shim_(shim) {}
  void OnEvict(uintptr_t ptr, size_t bytes, EvictReason reason, int result,
               int64_t latency_ns) override {
    shim_->RecordEvict(ptr, bytes, reason, result, latency_ns);
  }
  void OnWarning(const std::string& message) override { shim_->Warn(message); }

 private:
  Shim* const shim_;
};

real::Lazy<CUresult (*)(CUcontext*)> g_ctx_get_current;
real::Lazy<CUresult (*)(CUdevice*)> g_ctx_get_device;
real::Lazy<CUresult (*)(int*)> g_driver_get_version;

struct sigaction g_old_action[NSIG];
std::atomic<bool> g_exit_handlers_installed{false};

void ExitHandler() {
  if (Shim* shim = g_shim.load(std::memory_order_acquire)) shim->AtExit("exit");
}
void ForkChildHandler() {
  if (Shim* shim = g_shim.load(std::memory_order_acquire)) shim->InForkChild();
}
void SignalHandler(int sig) {
  const int saved_errno = errno;
  if (Shim* shim = g_shim.load(std::memory_order_acquire)) shim->OnSignal(sig);
  errno = saved_errno;
}

}  // namespace

const char* ViaName(Via via) {
  switch (via) {
    case Via::kSymbol: return "symbol";
    case Via::kDlsym: return "dlsym";
    case Via::kGetProc: return "getproc";
  }
  return "symbol";
}

Shim::Shim() = default;

Shim* Shim::Active() {
  if (g_setup.load(std::memory_order_acquire) == 0) {
    static std::once_flag once;
    std::call_once(once, [] {
      ScopedInsideLazypin inside;
      auto* shim = new Shim();  // never destroyed: hooks may run until the very end
      shim->Init();
      g_setup.store(1, std::memory_order_release);
    });
  }
  return g_shim.load(std::memory_order_acquire);
}

Shim* Shim::IfActive() { return g_shim.load(std::memory_order_acquire); }

void Shim::Init() {
  start_mono_ns_ = MonotonicNs();
  start_unix_ns_ = UnixNs();
  const uint64_t ram = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                       static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  ParsedConfig parsed = ParseConfig([](const char* name) { return getenv(name); }, ram);
  config_ = parsed.config;
  config_errors_ = std::move(parsed.errors);
  for (const std::string& error : config_errors_) fprintf(stderr, "%s\n", error.c_str());
  if (config_.mode == Mode::kOff) return;  // g_shim stays null: every hook passes through

  if (config_.log_path.empty()) {
    config_.log_path = fmt::format("lazypin-{}-%p.jsonl", program_invocation_short_name);
  }
  std::string error;
  log_ = Log::Open(ExpandLogPath(config_.log_path, getpid()), &error);
  if (log_ == nullptr) fprintf(stderr, "%s\n", error.c_str());

  if (config_.mode == Mode::kDefer) {
    std::string why;
    if (!MemoryHooksSelfTest(&why)) {
      config_.mode = Mode::kLog;
      config_errors_.push_back(fmt::format(
          "lazypin: LAZYPIN_MODE=defer turned off, logging only: the memory hooks' self-test "
          "failed ({})", why));
      fprintf(stderr, "%s\n", config_errors_.back().c_str());
    }
  }
  WriteHeader();
  for (const std::string& e : config_errors_) {
    if (log_) log_->Write(fmt::format(R"({{"type":"warning","t_ns":0,"message":{}}})", JsonString(e)));
  }
  if (config_.mode == Mode::kDefer) {
    PoolLimits limits;
    limits.max_bytes = config_.pool_bytes;
    limits.max_entries = config_.pool_entries;
    limits.check_frames = config_.check_pfn;
    pool_driver_ = std::make_unique<RealPoolDriver>();
    pool_observer_ = std::make_unique<ShimPoolObserver>(this);
    pool_ = std::make_unique<Pool>(pool_driver_.get(), pool_observer_.get(), limits);
    __atomic_store_n(&g_active_pool, pool_.get(), __ATOMIC_RELEASE);
    if (config_.check_pfn) {
      std::vector<uint64_t> frames;
      if (!ReadPageFrames(reinterpret_cast<uintptr_t>(&frames), 1, &frames)) {
        Warn("LAZYPIN_CHECK_PFN=1 needs root (CAP_SYS_ADMIN) to read /proc/self/pagemap; "
             "page checks are off");
      }
    }
    collector_ = std::make_unique<Collector>(pool_.get(), config_.idle_ms, &RealFree);
    g_collector.store(collector_.get(), std::memory_order_release);
  }
  pthread_atfork(nullptr, nullptr, ForkChildHandler);
  for (int sig : {SIGTERM, SIGINT}) {
    struct sigaction old;
    if (sigaction(sig, nullptr, &old) == 0 && !(old.sa_flags & SA_SIGINFO) &&
        old.sa_handler == SIG_DFL) {
      struct sigaction action = {};
      action.sa_handler = SignalHandler;
      sigemptyset(&action.sa_mask);
      action.sa_flags = SA_RESTART;
      g_old_action[sig] = old;
      sigaction(sig, &action, nullptr);
    }
  }
  g_shim.store(this, std::memory_order_release);
}

void Shim::WriteHeader() {
  if (!log_) return;
  std::string argv;
  const std::string cmdline = ReadSmallFile("/proc/self/cmdline");
  for (size_t i = 0; i < cmdline.size();) {
    const size_t end = cmdline.find('\0', i);
    const size_t stop = end == std::string::npos ? cmdline.size() : end;
    argv += (argv.empty() ? "" : ",") + JsonString(cmdline.substr(i, stop - i));
    i = stop + 1;
  }
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[n > 0 ? n : 0] = '\0';
  int driver_version = 0;
  if (auto get_version = DriverFn(g_driver_get_version, "cuDriverGetVersion")) {
    if (get_version(&driver_version) != CUDA_SUCCESS) driver_version = 0;
  }
  log_->Write(fmt::format(
      R"({{"type":"header","format":1,"lazypin":"{}","pid":{},"exe":{},"argv":[{}],"mode":"{}",)"
      R"("start_unix_ns":{},"driver_version":{},"config":{{"mode":"{}","log":{},"summary":{},)"
      R"("pool_bytes":{},"pool_entries":{},"idle_ms":{},"check_pfn":{},"release_at_exit":{}}}}})",
      kVersion, getpid(), JsonString(exe), argv, ModeName(config_.mode), start_unix_ns_,
      driver_version, ModeName(config_.mode), JsonString(log_->path()),
      config_.summary ? "true" : "false", config_.pool_bytes, config_.pool_entries,
      config_.idle_ms, config_.check_pfn ? "true" : "false",
      config_.release_at_exit ? "true" : "false"));
}

int64_t Shim::Now() const { return MonotonicNs() - start_mono_ns_; }

void Shim::InstallExitHandlersOnce() {
  // After the first real call, so that cudart (set up inside that call)
  // registered its own exit handler first, and ours runs while CUDA is alive.
  if (g_exit_handlers_installed.load(std::memory_order_relaxed) ||
      g_exit_handlers_installed.exchange(true)) {
    return;
  }
  atexit(ExitHandler);
}

void Shim::Record(Api api, Via via, void* ptr, size_t bytes, unsigned flags, int result,
                  int64_t latency_ns, Action action, int evicted) {
  stats_.RecordCall(api, bytes, result, latency_ns, action);
  if (!log_) return;
  fmt::memory_buffer line;
  fmt::format_to(std::back_inserter(line),
                 FMT_COMPILE(R"({{"type":"call","t_ns":{},"tid":{},"api":"{}","via":"{}","ptr":"{}",)"
                             R"("bytes":{},"flags":{},"result":{},"latency_ns":{},"action":"{}",)"
                             R"("evicted":{}}})"),
                 Now(), ThreadId(), ApiName(api), ViaName(via), ptr, bytes, flags, result,
                 latency_ns, ActionName(action), evicted);
  log_->Write(std::string_view(line.data(), line.size()));
}

void Shim::RecordEvict(uintptr_t ptr, size_t bytes, EvictReason reason, int result,
                       int64_t latency_ns) {
  stats_.RecordEvict(latency_ns);
  if (!log_) return;
  log_->Write(fmt::format(
      R"({{"type":"evict","t_ns":{},"tid":{},"ptr":"{}","bytes":{},"reason":"{}","result":{},"latency_ns":{}}})",
      Now(), ThreadId(), reinterpret_cast<void*>(ptr), bytes, EvictReasonName(reason), result,
      latency_ns));
}

void Shim::Warn(const std::string& message) {
  fprintf(stderr, "lazypin: %s\n", message.c_str());
  if (log_) {
    log_->Write(fmt::format(R"({{"type":"warning","t_ns":{},"message":{}}})", Now(),
                            JsonString(message)));
  }
}

int Shim::RuntimeCall(Api api, Via via, void* ptr, size_t bytes, unsigned flags,
                      absl::FunctionRef<int()> real) {
  const int64_t t0 = MonotonicNs();
  // A hit or a deferral needs no driver call: take it here and spare the
  // program cudart's own path. A register needs the context cudart will use:
  // the current one (cudart uses it when there is one). Everything else goes
  // through cudart to the driver hook beneath, which acts and reports, so
  // that cudart sees only the driver's final answer (its last error too).
  std::optional<Outcome> fast;
  if (pool_ != nullptr) {
    ScopedInsideLazypin inside;
    if (IsRegister(api)) {
      CUcontext ctx = nullptr;
      if (auto get = DriverFn(g_ctx_get_current, "cuCtxGetCurrent")) get(&ctx);
      if (ctx != nullptr) fast = pool_->TryHit(Request(ptr, bytes, flags, ctx));
    } else {
      fast = pool_->TryDefer(reinterpret_cast<uintptr_t>(ptr));
    }
  }
  Outcome outcome;
  if (fast) {
    outcome = *fast;
  } else {
    t_state.runtime_depth += 1;
    t_state.action = Action::kForward;
    t_state.evicted = 0;
    outcome.result = real();
    outcome.action = t_state.action;
    outcome.evicted = t_state.evicted;
    t_state.runtime_depth -= 1;
  }
  const int64_t latency = MonotonicNs() - t0;
  ScopedInsideLazypin inside;
  Record(api, via, ptr, bytes, flags, outcome.result, latency, outcome.action, outcome.evicted);
  InstallExitHandlersOnce();
  return outcome.result;
}

RegisterRequest Shim::Request(void* ptr, size_t bytes, unsigned flags, void* ctx) {
  RegisterRequest request;
  request.ptr = reinterpret_cast<uintptr_t>(ptr);
  request.bytes = bytes;
  request.flags = flags;
  request.ctx = ctx;
  CUdevice device = -1;
  if (auto get = DriverFn(g_ctx_get_device, "cuCtxGetDevice")) {
    if (get(&device) != CUDA_SUCCESS) device = -1;
  }
  request.device = device;
  return request;
}

Outcome Shim::PoolRegister(void* ptr, size_t bytes, unsigned flags,
                           absl::FunctionRef<int()> real) {
  CUcontext ctx = nullptr;
  if (auto get = DriverFn(g_ctx_get_current, "cuCtxGetCurrent")) get(&ctx);
  return pool_->Register(Request(ptr, bytes, flags, ctx), real);
}

int Shim::DriverCall(Api api, Via via, void* ptr, size_t bytes, unsigned flags,
                     absl::FunctionRef<int()> real, absl::FunctionRef<Outcome()> pooled) {
  const bool nested = t_state.runtime_depth > 0;  // cudart calling down: it records
  if (pool_ == nullptr && nested) return real();
  const int64_t t0 = MonotonicNs();
  Outcome outcome;
  if (pool_ == nullptr) {
    outcome.result = real();
  } else {
    ScopedInsideLazypin inside;
    outcome = pooled();
  }
  const int64_t latency = MonotonicNs() - t0;
  if (nested) {
    t_state.action = outcome.action;
    t_state.evicted = outcome.evicted;
    return outcome.result;
  }
  ScopedInsideLazypin inside;
  Record(api, via, ptr, bytes, flags, outcome.result, latency, outcome.action, outcome.evicted);
  InstallExitHandlersOnce();
  return outcome.result;
}

int Shim::DriverRegister(Api api, Via via, void* ptr, size_t bytes, unsigned flags,
                         absl::FunctionRef<int()> real) {
  return DriverCall(api, via, ptr, bytes, flags, real,
                    [&] { return PoolRegister(ptr, bytes, flags, real); });
}

int Shim::DriverUnregister(Api api, Via via, void* ptr, absl::FunctionRef<int()> real) {
  return DriverCall(api, via, ptr, 0, 0, real, [&] {
    return pool_->Unregister(reinterpret_cast<uintptr_t>(ptr), real);
  });
}

void Shim::BeforeContextDestroy(void* ctx) {
  if (pool_ == nullptr) return;
  ScopedInsideLazypin inside;
  pool_->DropContext(ctx);
}

void Shim::BeforePrimaryContextReset(int device, bool forget_in_use) {
  if (pool_ == nullptr) return;
  ScopedInsideLazypin inside;
  pool_->DropDevice(device, forget_in_use);
}

void Shim::BeforeQuery(uintptr_t ptr) {
  if (pool_ == nullptr || !pool_->MaybeHolds(ptr, ptr + 1)) return;
  ScopedInsideLazypin inside;
  pool_->Invalidate(ptr, ptr + 1, EvictReason::kQuery);
}

void Shim::MemoryLeaving(uintptr_t lo, uintptr_t hi, EvictReason reason) {
  Pool* pool = ActivePool();
  if (pool == nullptr || t_state.inside > 0 || !pool->MaybeHolds(lo, hi)) return;
  ScopedInsideLazypin inside;
  pool->Invalidate(lo, hi, reason);
}

bool Shim::HandOverFree(void* block, size_t bytes, bool may_wait) {
  Collector* collector = g_collector.load(std::memory_order_acquire);
  const uint64_t ticket = collector != nullptr ? collector->TakeFree(block, bytes) : 0;
  if (ticket == 0) return false;
  // What the program freed must not pile up (a program that frees 40 GiB and
  // allocates 40 GiB again would need both): past the bound, this free waits
  // for its block, as it did when the free hook unregistered inline. Bounded,
  // so that a signal handler's free that interrupted the driver (which the
  // collector then waits for) only waits that long.
  if (may_wait && collector->PendingBytes() > kMaxPendingFreeBytes) {
    collector->WaitFreed(ticket, kPendingFreeWaitMs);
  }
  return true;
}

void Shim::AtExit(const char* ended_by) {
  static std::atomic<bool> done{false};
  if (done.exchange(true)) return;
  ScopedInsideLazypin inside;
  g_collector.store(nullptr, std::memory_order_release);
  if (collector_) collector_->Stop();
  if (pool_ && config_.release_at_exit) pool_->ReleaseAll(EvictReason::kExit);
  const PoolCounters counters = pool_ ? pool_->Counters() : PoolCounters{};
  std::string log_note;
  if (log_) {
    log_->Close(stats_.SummaryJson(counters, Now(), ended_by));
    const std::string failure = log_->failure();
    log_note = failure.empty()
                   ? fmt::format("lazypin: log: {}\n", log_->path())
                   : fmt::format("lazypin: log {} is incomplete: {}\n", log_->path(), failure);
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
  // summary by hand, then die of the signal as the program would have.
  if (log_) {
    log_->DrainFromSignal(500);
    char line[160];
    const char* name = sig == SIGTERM ? "SIGTERM" : "SIGINT";
    int64_t t = Now();
    char digits[24];
    int n = 0;
    do { digits[n++] = static_cast<char>('0' + t % 10); t /= 10; } while (t > 0 && n < 23);
    size_t len = 0;
    for (const char* s = R"({"type":"summary","t_ns":)"; *s; ++s) line[len++] = *s;
    while (n > 0) line[len++] = digits[--n];
    for (const char* s = R"(,"ended_by":")"; *s; ++s) line[len++] = *s;
    for (const char* s = name; *s; ++s) line[len++] = *s;
    for (const char* s = R"("})"; *s; ++s) line[len++] = *s;
    log_->WriteDirect(std::string_view(line, len));
  }
  g_shim.store(nullptr, std::memory_order_release);
  sigaction(sig, &g_old_action[sig], nullptr);
  raise(sig);
}

void Shim::InForkChild() {
  // The child has one thread and none of ours: forget the pool without a
  // driver call or a lock, leave the parent's log alone, pass everything through.
  if (pool_) pool_->AbandonAfterFork();
  __atomic_store_n(&g_active_pool, nullptr, __ATOMIC_RELAXED);
  g_collector.store(nullptr, std::memory_order_relaxed);
  g_shim.store(nullptr, std::memory_order_relaxed);
}

}  // namespace lazypin
