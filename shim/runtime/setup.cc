// setup: what lazypin runs in this process, from its configuration (see shim.h).
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <mutex>

#include "capture.h"
#include "cuda_pool_driver.h"
#include "fmt/format.h"
#include "hooks_alloc.h"
#include "hooks_memory.h"
#include "memory_limit.h"
#include "pfn.h"
#include "records.h"
#include "shim.h"
#include "sys.h"
#include "thread_state.h"

extern char** environ;

namespace lazypin {
namespace {

constexpr const char* kVersion = "0.1.0";

}  // namespace

// Parses the configuration, builds the call path (and, deferring, the pool
// and its collector thread), publishes it, and starts the log's writer
// thread, which creates the file and writes the header once the first record
// is there (records are kept in memory until then).
void Shim::Init() {
  process_.Mark();
  start_mono_ns_ = MonotonicNs();
  start_unix_ns_ = UnixNs();
  ParsedConfig parsed =
      ParseConfig([](const char* name) { return getenv(name); }, MemoryForPercentages(), environ);
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
  recorder_ = std::make_unique<Recorder>(config_, start_mono_ns_, ExpandLogPath(pattern, getpid()),
                                         [] { g_shim->InstallHandlersOnce(); });
  env_ = std::make_unique<RecordingCudaEnv>(recorder_.get());
  if (effective_ == Mode::kDefer) {
    PoolLimits limits;
    limits.max_bytes = config_.pool_bytes;
    limits.max_entries = config_.pool_entries;
    limits.check_frames = config_.check_pfn;
    pool_driver_ = MakeCudaPoolDriver(watch_.get(), config_.defer_shared, config_.prefault_threads);
    pool_ = std::make_unique<Pool>(pool_driver_.get(), recorder_.get(), limits);
    if (config_.host_alloc_bytes > 0) {
      HostAllocLimits host_limits;
      host_limits.max_bytes = config_.host_alloc_bytes;
      host_limits.max_entries = config_.pool_entries;
      host_driver_ = MakeCudaHostAllocDriver();
      host_cache_ = std::make_unique<HostAllocCache>(host_driver_.get(), recorder_.get(), host_limits);
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
  dispatch_ = std::make_unique<Dispatch>(env_.get(), pool_.get(), config_.unregister_wait,
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
          pool_.get(), env_.get(), recorder_.get(),
          AutoPinLimits{config_.autopin_min, config_.autopin_bytes,
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
  const bool started = recorder_->Start([this](const std::string& path) {
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
  info.driver_version = env_->DriverVersion();
  info.config = &config_;
  info.log_path = log_path;
  return HeaderRecord(info);
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
