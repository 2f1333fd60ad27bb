// memory_limit: how much memory this process may use and how much it can
// still get: the machine's, or its cgroup's (v2 memory.max and
// memory.current, v1 memory.limit_in_bytes and memory.usage_in_bytes) when
// lower, and the address-space limits (RLIMIT_AS, RLIMIT_DATA). What "N% of
// RAM" means in the options, and the headroom that kept memory yields to
// (core/memory_budget.h).
#pragma once

#include <atomic>
#include <cstdint>

#include "descriptors.h"

namespace lazypin {

// The machine's memory, or the cgroup's limit when lower.
uint64_t MemoryForPercentages();

// This process's memory cgroup (cgroup v1's memory controller when there is
// one, else cgroup v2), /proc/meminfo, and its address-space limits against
// /proc/self/statm. Reading is a pread of files opened at construction (on
// the thread that constructs it; statm, needed only under an address-space
// limit, may be opened by a reading on a program thread, never on one of
// lazypin's): async-signal-safe, allocation-free.
class MemoryProbe {
 public:
  // Finds the cgroup's files; `open_files` keeps them (under a cgroup limit),
  // /proc/meminfo, and /proc/self/statm (under RLIMIT_AS or RLIMIT_DATA)
  // open for Headroom(), close-on-exec, high (descriptors.h).
  explicit MemoryProbe(bool open_files);
  // Reads these files instead (tests): a limit ("max": none), a usage, and a
  // meminfo-style text with "MemAvailable: N kB"; an empty path: not read.
  MemoryProbe(const char* limit_path, const char* usage_path, const char* meminfo_path);
  MemoryProbe(const MemoryProbe&) = delete;
  MemoryProbe& operator=(const MemoryProbe&) = delete;
  ~MemoryProbe();

  // The machine's memory, or the cgroup's limit when lower.
  uint64_t Limit() const;
  // The bytes the program can still get now (fresh): the least of cgroup
  // limit - usage, MemAvailable, RLIMIT_AS - mapped, RLIMIT_DATA - data;
  // INT64_MAX when none can be read; 0 once the program took over a
  // descriptor the probe held (then nothing is kept).
  int64_t Headroom() const;
  // For MemoryBudget's injected reading.
  static int64_t HeadroomOf(const void* probe) {
    return static_cast<const MemoryProbe*>(probe)->Headroom();
  }

 private:
  char limit_path_[640] = "";
  char usage_path_[640] = "";
  char meminfo_path_[64] = "/proc/meminfo";
  // Files opened by the test constructor, or held (`open_files`).
  mutable HeldFd limit_fd_, usage_fd_, meminfo_fd_, statm_fd_;
  mutable std::atomic<bool> statm_opened_{false};  // OpenStatm ran (once)
  bool held_ = false;  // the files were opened at construction: a lost one means 0
  static bool AddressSpaceLimited();  // RLIMIT_AS or RLIMIT_DATA is finite
  void OpenStatm() const;
};

}  // namespace lazypin
