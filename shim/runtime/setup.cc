// setup: what lazypin runs in this process, from its configuration (see shim.h).
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>


#include "capture.h"
#include "cuda_pool_driver.h"
#include "fmt/format.h"
#include "glibc_blocks.h"
#include "memory_budget.h"
#include "memory_limit.h"
#include "option_limits.h"
#include "pfn.h"
#include "records.h"
#include "seccomp.h"
#include "shim.h"
#include "sys.h"
#include "thread_state.h"
#include "zero_fill.h"

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
  SeccompFiltered();  // before any optional system call (seccomp.h)
  StreamZeroFrom();   // its one-time initialization here, never inside a program's malloc
  process_.Mark();
  start_mono_ns_ = MonotonicNs();
  start_unix_ns_ = UnixNs();
  // Read here, inside the program's call: the header is written later by
  // the log's thread, which opens nothing (an open there could take, for a
  // moment, the lowest number the program's own open() should get).
  cmdline_ = ReadSmallFile("/proc/self/cmdline");
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
    if (!hooks_.memory_hooks_self_test(&failed)) {
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
  recorder_ = std::make_unique<Recorder>(config_, start_mono_ns_, ExpandLogPath(config_.log_path, getpid()),
                                         [] { g_shim->InstallHandlersOnce(); });
  env_ = std::make_unique<CudaEnv>();
  if (effective_ == Mode::kDefer) {
    pool_driver_ = MakeCudaPoolDriver(watch_.get(), config_.defer_shared, config_.prefault_threads,
                                      config_.prefault_huge);
    pool_ = std::make_unique<Pool>(pool_driver_.get(), recorder_.get(), PoolLimitsFrom(config_));
    // Its files are opened here, on the program's thread, and only where
    // anything may be kept (the README's "What lazypin holds").
    probe_ = std::make_unique<MemoryProbe>(
        /*open_files=*/config_.host_alloc_bytes > 0 || config_.reuse_freed != 0);
    budget_ = std::make_unique<MemoryBudget>(&MemoryProbe::HeadroomOf, probe_.get(),
                                             config_.keep_margin, hooks_.alloc_gauge);
    if (config_.host_alloc_bytes > 0) {
      HostAllocLimits host_limits = HostAllocLimitsFrom(config_);
      host_limits.budget = budget_.get();
      host_driver_ = MakeCudaHostAllocDriver();
      host_cache_ = std::make_unique<HostAllocCache>(host_driver_.get(), recorder_.get(),
                                                     host_limits);
    }
    // Whether freed blocks are glibc's: then their headers are read as
    // glibc's free reads them (MemoryGuard), and they may come back.
    std::string why_not;
    glibc_allocator_ = hooks_.allocator_reuse_check(&why_not);
    if (glibc_allocator_) GlibcNoteEnvironment();
    bool reuse = false;
    if (config_.reuse_freed != 0) {
      reuse = glibc_allocator_;
      if (reuse) {
        pool_->EnableReuse(
            ReuseHooks{hooks_.real_free, hooks_.alloc_gauge, config_.reuse_freed, budget_.get()});
      } else {  // said once, in the log: the program runs as with LAZYPIN_REUSE_FREED=0
        warnings_.push_back(fmt::format(
            "lazypin: LAZYPIN_REUSE_FREED steps aside: {}; freed blocks are unregistered and freed",
            why_not));
      }
    }
    collector_ = std::make_unique<Collector>(pool_.get(), config_.idle_ms, hooks_.real_free, FreeBounds{},
                                             &Captures(), host_cache_.get(), budget_.get());
    budget_->SetWaker([](void* c) { static_cast<Collector*>(c)->Nudge(); }, collector_.get());
    guard_ = std::make_unique<MemoryGuard>(pool_.get(), collector_.get(), &LeftSetUpProcess,
                                           host_cache_.get(), reuse, glibc_allocator_,
                                           budget_.get(), config_.unregister_wait);
  }
  dispatch_ = std::make_unique<Dispatch>(env_.get(), recorder_.get(), pool_.get(), config_.unregister_wait,
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
          pool_.get(), env_.get(), recorder_.get(), AutoPinLimitsFrom(config_));
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
  MemWatchOptions options;
  options.under_seccomp = config_.watch == WatchMode::kKernel;  // asked for: tried
  watch_ = MemWatch::Open(&watch_reason_, options);
  if (watch_ == nullptr && SeccompFilterSeen()) TakeSeccompNotice();  // said by watch_reason_
  return watch_ != nullptr || config_.watch == WatchMode::kAuto;
}

std::string Shim::HeaderLine(const std::string& log_path) {
  HeaderInfo info;
  info.version = kVersion;
  info.pid = getpid();
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  info.exe.assign(exe, n > 0 ? static_cast<size_t>(n) : 0);
  info.cmdline = cmdline_;
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

}  // namespace lazypin
