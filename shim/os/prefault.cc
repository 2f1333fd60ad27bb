// prefault: large first registers faulted in by the program's cores (see prefault.h).
#include "prefault.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "page_class.h"
#include "pages.h"
#include "seccomp.h"
#include "thread_state.h"

namespace lazypin {
namespace {

constexpr unsigned kIoMemory = 0x04;  // CU_MEMHOSTREGISTER_IOMEMORY
constexpr unsigned kReadOnly = 0x08;  // CU_MEMHOSTREGISTER_READ_ONLY
constexpr unsigned kKnownFlags = 0x0f;  // PORTABLE, DEVICEMAP, IOMEMORY, READ_ONLY
constexpr int kMpolDefault = 0, kMpolPreferred = 1;
constexpr int kMaxNodes = 1024;
constexpr int kMaxMappings = 256;  // a range of more mappings than this is left to the driver
constexpr int kMadvHugepage = 14;
std::atomic<bool> g_unsupported{false};  // no MADV_POPULATE_WRITE (checked once)

uintptr_t HugeFloor(uintptr_t a) { return a & ~(kHugeBytes - 1); }
uintptr_t HugeCeil(uintptr_t a) {
  const uintptr_t up = a + kHugeBytes - 1;
  return up < a ? HugeFloor(a) : HugeFloor(up);
}

// A write fault that changes no byte, even against a concurrent writer.
inline void Touch(uintptr_t a) {
  __atomic_fetch_or(reinterpret_cast<unsigned char*>(a), static_cast<unsigned char>(0),
                    __ATOMIC_RELAXED);
}

bool Resident(uintptr_t page) {
  unsigned char v = 0;
  return mincore(reinterpret_cast<void*>(page), PageSize(), &v) == 0 && (v & 1) != 0;
}

// Protection keys: helpers write with the caller's rights (PKRU).
bool HavePkeys() {
#if defined(__x86_64__)
  static const bool have = [] {
    unsigned a = 7, b, c = 0, d;
    __asm__ volatile("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d));
    return (c & (1u << 4)) != 0;  // OSPKE: the kernel enabled them
  }();
  return have;
#else
  return false;
#endif
}
uint32_t ReadPkru() {
#if defined(__x86_64__)
  uint32_t eax, edx;
  __asm__ volatile(".byte 0x0f,0x01,0xee" : "=a"(eax), "=d"(edx) : "c"(0));  // rdpkru
  return eax;
#else
  return 0;
#endif
}
void WritePkru(uint32_t v) {
#if defined(__x86_64__)
  __asm__ volatile(".byte 0x0f,0x01,0xef" : : "a"(v), "c"(0), "d"(0) : "memory");  // wrpkru
#else
  (void)v;
#endif
}

struct Work {
  PrefaultSlice slice;
  bool huge;
  int prefer_node;
  bool set_pkru;
  uint32_t pkru;
  bool ok;
};

void TouchSlice(Work* w) {
  const uintptr_t page = PageSize();
  const uintptr_t lo = w->slice.lo, hi = w->slice.hi;
  for (uintptr_t block = HugeFloor(lo); block < hi; block += kHugeBytes) {
    const uintptr_t a = std::max(block, lo);
    const uintptr_t b = std::min(block + kHugeBytes, hi);
    uintptr_t p = a;
    if (w->huge && a == block && b == block + kHugeBytes) {
      Touch(a);
      if (Resident(b - page)) continue;  // one huge page: the whole block is in
      p = a + page;
    }
    for (; p < b; p += page) Touch(p);
  }
  w->ok = true;
}

void* Helper(void* arg) {
  auto* w = static_cast<Work*>(arg);
  ScopedInsideLazypin inside;
  if (w->set_pkru) WritePkru(w->pkru);
  if (w->prefer_node >= 0 && w->prefer_node < kMaxNodes) {
    // Where the caller's own faults would have put the pages (first touch).
    unsigned long mask[kMaxNodes / 64] = {};
    mask[w->prefer_node / 64] = 1ul << (w->prefer_node % 64);
    syscall(SYS_set_mempolicy, kMpolPreferred, mask, sizeof(mask) * 8);
  }
  TouchSlice(w);
  return nullptr;
}

// The caller's NUMA node when its memory policy is the default (first touch), else -1.
int CallerNode() {
  int mode = -1;
  if (syscall(SYS_get_mempolicy, &mode, nullptr, 0, nullptr, 0) != 0 || mode != kMpolDefault) {
    return -1;
  }
  unsigned cpu = 0, node = 0;
  if (getcpu(&cpu, &node) != 0 || node >= kMaxNodes) return -1;
  return static_cast<int>(node);
}

// "0-3,8,10-11" into cpus; false if malformed.
bool ParseCpuList(const char* s, std::vector<int>* out) {
  while (*s != '\0' && *s != '\n') {
    char* end;
    long a = strtol(s, &end, 10);
    if (end == s || a < 0) return false;
    long b = a;
    s = end;
    if (*s == '-') {
      b = strtol(s + 1, &end, 10);
      if (end == s + 1 || b < a) return false;
      s = end;
    }
    for (long c = a; c <= b && c < CPU_SETSIZE; ++c) out->push_back(static_cast<int>(c));
    if (*s == ',') ++s;
  }
  return true;
}

// The node of each CPU (index: CPU), -1 where unknown; read once.
const std::vector<int>& CpuNodes() {
  static const std::vector<int>* nodes = [] {
    auto* v = new std::vector<int>(CPU_SETSIZE, -1);
    for (int node = 0; node < kMaxNodes; ++node) {
      char path[96];
      snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/cpulist", node);
      const int fd = open(path, O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        if (node > 64) break;  // node numbers can have holes; none this far
        continue;
      }
      char buf[4096];
      const ssize_t n = read(fd, buf, sizeof(buf) - 1);
      close(fd);
      if (n <= 0) continue;
      buf[n] = '\0';
      std::vector<int> cpus;
      if (!ParseCpuList(buf, &cpus)) continue;
      for (int c : cpus) (*v)[c] = node;
    }
    return v;
  }();
  return *nodes;
}

// Whether every page of [lo, hi) is private anonymous memory mapped readable
// and writable, as a writable register needs it: a range the driver would
// refuse (a PROT_NONE or read-only page, a hole) gets nothing faulted in.
// `starts` (if given) gets each mapping's first address in the range.
bool PrefaultableRange(uintptr_t lo, uintptr_t hi, uintptr_t* starts = nullptr, int* count = nullptr) {
  lo = PageFloor(lo);
  hi = PageCeil(hi);
  uintptr_t cursor = lo;
  bool ok = true;
  int n = 0;
  const bool read = ForEachMapping(lo, hi, [&](const Mapping& m) {
    if (m.lo > cursor || m.shared || m.has_file || !m.readable || !m.writable) {
      ok = false;
      return false;
    }
    if (starts != nullptr) {
      if (n == kMaxMappings) {
        ok = false;
        return false;
      }
      starts[n] = std::max(m.lo, lo);
    }
    ++n;
    cursor = m.hi;
    return cursor < hi;
  });
  if (count != nullptr) *count = n;
  return read && ok && cursor >= hi;
}

}  // namespace

ThpMode ParseThpMode(const char* text) {
  if (strstr(text, "[always]") != nullptr) return ThpMode::kAlways;
  if (strstr(text, "[madvise]") != nullptr) return ThpMode::kMadvise;
  if (strstr(text, "[never]") != nullptr) return ThpMode::kNever;
  return ThpMode::kUnknown;
}

ThpMode ReadThpMode() {
  static const ThpMode mode = [] {
    const int fd = open("/sys/kernel/mm/transparent_hugepage/enabled", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ThpMode::kNever;  // a kernel without them
    char buf[256];
    const ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0) return ThpMode::kUnknown;
    buf[n] = '\0';
    return ParseThpMode(buf);
  }();
  return mode;
}

PrefaultPlan PlanPrefault(uintptr_t lo, uintptr_t hi, int max_threads, const PrefaultMachine& m) {
  PrefaultPlan plan;
  if (max_threads < 1 || lo >= hi || m.cpus.empty()) return plan;
  // Several nodes: the helpers stay on the caller's node where it has two
  // CPUs or more in the mask; else any CPU of the mask, preferring its node.
  std::vector<int> local;
  bool several = false;
  for (size_t i = 0; i < m.cpus.size(); ++i) {
    const int node = i < m.nodes.size() ? m.nodes[i] : -1;
    if (node != (m.nodes.empty() ? -1 : m.nodes[0])) several = true;
    if (m.caller_node >= 0 && node == m.caller_node) local.push_back(m.cpus[i]);
  }
  size_t usable = m.cpus.size();
  if (several && m.caller_node >= 0) {
    plan.prefer_node = m.caller_node;
    if (local.size() >= 2) {
      usable = local.size();
      plan.helper_cpus = local;
    }
  }
  const uintptr_t bytes = hi - lo;
  size_t threads = std::min<size_t>({static_cast<size_t>(max_threads), usable,
                                     static_cast<size_t>(kPrefaultMaxThreads),
                                     std::max<size_t>(1, bytes / kPrefaultMinSlice)});
  const uintptr_t per = bytes / threads;
  for (uintptr_t at = lo; at < hi && plan.slices.size() < threads;) {
    uintptr_t end = plan.slices.size() == threads - 1 ? hi : HugeCeil(at + per);
    if (end > hi || end <= at) end = hi;
    plan.slices.push_back(PrefaultSlice{at, end});
    at = end;
  }
  if (plan.slices.size() <= 1) plan.helper_cpus.clear();
  return plan;
}

PrefaultMachine ReadPrefaultMachine() {
  PrefaultMachine m;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return m;
  const std::vector<int>& nodes = CpuNodes();
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &set)) continue;
    m.cpus.push_back(c);
    m.nodes.push_back(nodes[c]);
  }
  m.caller_node = CallerNode();
  return m;
}

bool CpuHasProtectionKeys() { return HavePkeys(); }

void PrefaultAssumeNoPopulateForTest(bool none) {
  g_unsupported.store(none, std::memory_order_relaxed);
}

bool HugePagesRefused(uintptr_t lo, uintptr_t hi) {
  if (prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0) == 1) return true;
  FILE* f = fopen("/proc/self/smaps", "re");
  if (f == nullptr) return true;  // unknown: leave the program's setting alone
  char line[512];
  bool inside = false, refused = false;
  while (fgets(line, sizeof(line), f) != nullptr) {
    unsigned long a, b;
    char dash;
    if (sscanf(line, "%lx%c%lx ", &a, &dash, &b) == 3 && dash == '-' &&
        strchr(line, ':') > strchr(line, ' ')) {
      if (a >= hi) break;
      inside = b > lo;
      continue;
    }
    if (inside && strncmp(line, "VmFlags:", 8) == 0) {
      for (const char* p = strstr(line, " nh"); p != nullptr; p = strstr(p + 1, " nh")) {
        if (p[3] == ' ' || p[3] == '\n' || p[3] == '\0') refused = true;
      }
    }
  }
  fclose(f);
  return refused;
}

bool ShouldPrefault(uintptr_t lo, uintptr_t hi, unsigned flags, int threads) {
  if (threads <= 1 || hi - lo < kPrefaultMinBytes || (flags & ~kKnownFlags) != 0 ||
      (flags & (kReadOnly | kIoMemory)) != 0) {
    return false;
  }
  if (g_unsupported.load(std::memory_order_relaxed) && HavePkeys()) return false;
  if (SeccompFiltered()) {  // set_mempolicy, get_mempolicy, MADV_POPULATE_WRITE may be forbidden
    if (TakeSeccompNotice()) {
      fprintf(stderr, "lazypin: a seccomp filter is in force (%s); LAZYPIN_PREFAULT is off from "
              "now on (its system calls may be forbidden)\n", SeccompStatusText().c_str());
    }
    return false;
  }
  return PrefaultableRange(lo, hi);
}

PrefaultResult PrefaultRange(uintptr_t lo, uintptr_t hi, const PrefaultOptions& options) {
  PrefaultResult result;
  lo = PageFloor(lo);
  hi = PageCeil(hi);
  if (options.threads < 1 || lo >= hi) return result;
  uintptr_t starts[kMaxMappings];
  int mappings = 0;
  if (!PrefaultableRange(lo, hi, starts, &mappings)) return result;
  // Huge pages, asked for: on the range's whole blocks, unless refused.
  const uintptr_t hlo = HugeCeil(lo), hhi = HugeFloor(hi);
  const ThpMode thp = ReadThpMode();
  if (options.huge && hlo < hhi && (thp == ThpMode::kMadvise || thp == ThpMode::kAlways) &&
      !HugePagesRefused(lo, hi)) {
    result.advised = madvise(reinterpret_cast<void*>(hlo), hhi - hlo, kMadvHugepage) == 0;
    if (result.advised && !PrefaultableRange(lo, hi, starts, &mappings)) return result;
  }
  // The caller's own rights, mapping by mapping, through the kernel: what
  // it may not write, no helper touches (a memory protection key, say).
  for (int i = 0; i < mappings; ++i) {
    if (g_unsupported.load(std::memory_order_relaxed)) break;
    if (!PopulateWrite(reinterpret_cast<void*>(starts[i]), PageSize())) {
      if (errno != EINVAL) return result;  // the driver's own pin fails here too
      g_unsupported.store(true, std::memory_order_relaxed);
    }
  }
  if (g_unsupported.load(std::memory_order_relaxed) && HavePkeys()) return result;
  // Whether the mapping gives huge pages: its first whole block, faulted in.
  bool huge = false;
  if (hlo < hhi && thp != ThpMode::kNever) {
    Touch(hlo);
    huge = Resident(hlo + kHugeBytes - PageSize());
  }
  result.huge = huge;
  const PrefaultPlan plan = PlanPrefault(lo, hi, options.threads, ReadPrefaultMachine());
  const int n = static_cast<int>(plan.slices.size());
  if (n == 0) return result;
  Work work[kPrefaultMaxThreads];
  const bool pkeys = HavePkeys();
  const uint32_t pkru = pkeys ? ReadPkru() : 0;
  for (int i = 0; i < n; ++i) work[i] = Work{plan.slices[i], huge, plan.prefer_node, pkeys, pkru, false};
  // Helpers run with every signal blocked (the program's handlers are not
  // theirs); a helper that cannot be started leaves its slice to the caller.
  pthread_t helpers[kPrefaultMaxThreads];
  bool started[kPrefaultMaxThreads] = {};
  pthread_attr_t attr;
  const bool have_attr = pthread_attr_init(&attr) == 0;
  if (have_attr) {
    // A small stack (a helper only touches pages): glibc keeps the stacks of
    // joined threads mapped for reuse, address space the program's RLIMIT_AS counts.
    pthread_attr_setstacksize(&attr, size_t{64} << 10);
    if (!plan.helper_cpus.empty()) {
      cpu_set_t set;
      CPU_ZERO(&set);
      for (int c : plan.helper_cpus) CPU_SET(c, &set);
      pthread_attr_setaffinity_np(&attr, sizeof(set), &set);
    }
  }
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  for (int i = 1; i < n; ++i) {
    started[i] = pthread_create(&helpers[i], have_attr ? &attr : nullptr, &Helper, &work[i]) == 0;
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (have_attr) pthread_attr_destroy(&attr);
  TouchSlice(&work[0]);
  result.threads = 1;
  for (int i = 1; i < n; ++i) {
    if (started[i]) {
      pthread_join(helpers[i], nullptr);
      result.threads += 1;
    } else {
      TouchSlice(&work[i]);
    }
  }
  for (int i = 0; i < n; ++i) result.slices_ok += work[i].ok ? 1 : 0;
  result.touched = true;
  return result;
}

}  // namespace lazypin
