// page_class: range classification from the kernel's VMAs (see page_class.h).
#include "page_class.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/ioctl.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "pages.h"

namespace lazypin {
namespace {

// PROCMAP_QUERY (linux/fs.h, Linux 6.11), declared here for older headers.
struct ProcmapQuery {
  uint64_t size;
  uint64_t query_flags;
  uint64_t query_addr;
  uint64_t vma_start;
  uint64_t vma_end;
  uint64_t vma_flags;
  uint64_t vma_page_size;
  uint64_t vma_offset;
  uint64_t inode;
  uint32_t dev_major;
  uint32_t dev_minor;
  uint32_t vma_name_size;
  uint32_t build_id_size;
  uint64_t vma_name_addr;
  uint64_t build_id_addr;
};
constexpr unsigned long kProcmapQuery = _IOWR('f', 17, ProcmapQuery);
constexpr uint64_t kQueryVmaReadable = 0x01;
constexpr uint64_t kQueryVmaWritable = 0x02;
constexpr uint64_t kQueryVmaShared = 0x08;
constexpr uint64_t kQueryCoveringOrNext = 0x10;


std::atomic<int> g_have_query{-1};  // -1 unknown, 0 no, 1 yes

// QueryMappings on an open /proc/self/maps.
int QueryMappingsWith(int fd, uintptr_t lo, uintptr_t hi,
                      absl::FunctionRef<bool(const Mapping&)> visit) {
  uintptr_t addr = lo;
  while (addr < hi) {
    ProcmapQuery q = {};
    q.size = sizeof q;
    q.query_flags = kQueryCoveringOrNext;
    q.query_addr = addr;
    if (ioctl(fd, kProcmapQuery, &q) != 0) {
      if (errno == ENOENT) {  // no VMA at or above addr: an answer
        g_have_query.store(1, std::memory_order_relaxed);
        return 1;
      }
      if (errno == ENOTTY || errno == EINVAL) g_have_query.store(0, std::memory_order_relaxed);
      return -1;
    }
    g_have_query.store(1, std::memory_order_relaxed);
    if (q.vma_start >= hi) return 1;
    const Mapping m = {static_cast<uintptr_t>(q.vma_start), static_cast<uintptr_t>(q.vma_end),
                       (q.vma_flags & kQueryVmaShared) != 0,
                       q.inode != 0 || q.dev_major != 0 || q.dev_minor != 0,
                       (q.vma_flags & kQueryVmaReadable) != 0,
                       (q.vma_flags & kQueryVmaWritable) != 0};
    if (!visit(m)) return 1;
    addr = m.hi;
  }
  return 1;
}

// -1: the ioctl is not there; 0: done (visit said stop, or no more VMAs); 1: ok.
// /proc/self/maps is opened for each query and closed after it: lazypin holds
// no descriptor for it (the program's RLIMIT_NOFILE is its own; 1-2 us more).
int QueryMappings(uintptr_t lo, uintptr_t hi, absl::FunctionRef<bool(const Mapping&)> visit) {
  const int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  const int r = QueryMappingsWith(fd, lo, hi, visit);
  close(fd);
  return r;
}

// Parses one line "lo-hi perms offset major:minor inode [path]".
bool ParseMapsLine(const char* line, Mapping* m) {
  char* p;
  m->lo = strtoull(line, &p, 16);
  if (*p != '-') return false;
  m->hi = strtoull(p + 1, &p, 16);
  if (*p != ' ' || strlen(p) < 6) return false;
  m->readable = p[1] == 'r';
  m->writable = p[2] == 'w';
  m->shared = p[4] == 's';
  p += 5;
  while (*p == ' ') ++p;
  strtoull(p, &p, 16);  // offset
  const unsigned long major = strtoul(p, &p, 16);
  if (*p != ':') return false;
  const unsigned long minor = strtoul(p + 1, &p, 16);
  const unsigned long long inode = strtoull(p, &p, 10);
  m->has_file = inode != 0 || major != 0 || minor != 0;
  return true;
}

bool ParseMappings(uintptr_t lo, uintptr_t hi, absl::FunctionRef<bool(const Mapping&)> visit) {
  const int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[8192];
  size_t have = 0;
  bool done = false;
  while (!done) {
    const ssize_t n = read(fd, buf + have, sizeof buf - 1 - have);
    if (n <= 0) break;
    have += static_cast<size_t>(n);
    buf[have] = '\0';
    char* line = buf;
    char* nl;
    while (!done && (nl = strchr(line, '\n')) != nullptr) {
      *nl = '\0';
      Mapping m;
      if (ParseMapsLine(line, &m)) {
        if (m.lo >= hi) {
          done = true;
        } else if (m.hi > lo && !visit(m)) {
          done = true;
        }
      }
      line = nl + 1;
    }
    have = static_cast<size_t>(buf + have - line);
    memmove(buf, line, have);
  }
  close(fd);
  return true;
}

}  // namespace

const char* PageClassName(PageClass page_class) {
  switch (page_class) {
    case PageClass::kPrivateAnonymous: return "private_anonymous";
    case PageClass::kShared: return "shared";
    case PageClass::kFileBacked: return "file_backed";
    case PageClass::kUnmapped: return "unmapped";
    case PageClass::kUnknown: return "unknown";
  }
  return "?";
}

bool HaveProcmapQuery() {
  if (g_have_query.load(std::memory_order_relaxed) < 0) {
    QueryMappings(0, UINTPTR_MAX, [](const Mapping&) { return false; });
  }
  return g_have_query.load(std::memory_order_relaxed) == 1;
}

bool ForEachMapping(uintptr_t lo, uintptr_t hi, absl::FunctionRef<bool(const Mapping&)> visit,
                    MapsMethod method) {
  if (method != MapsMethod::kParse && g_have_query.load(std::memory_order_relaxed) != 0) {
    const int r = QueryMappings(lo, hi, visit);
    if (r >= 0) return true;
    if (method == MapsMethod::kProcmapQuery) return false;
  }
  if (method == MapsMethod::kProcmapQuery) return false;
  return ParseMappings(lo, hi, visit);
}

PageClass ClassifyRange(uintptr_t lo, uintptr_t hi, MapsMethod method) {
  lo = PageFloor(lo);
  hi = PageCeil(hi);
  if (lo >= hi) return PageClass::kUnmapped;
  uintptr_t cursor = lo;
  PageClass worst = PageClass::kPrivateAnonymous;
  auto rank = [](PageClass c) {
    switch (c) {
      case PageClass::kPrivateAnonymous: return 0;
      case PageClass::kFileBacked: return 1;
      case PageClass::kShared: return 2;
      default: return 3;
    }
  };
  const bool read = ForEachMapping(lo, hi, [&](const Mapping& m) {
    if (m.lo > cursor) {
      worst = PageClass::kUnmapped;
      return false;
    }
    const PageClass c = m.shared ? PageClass::kShared
                        : m.has_file ? PageClass::kFileBacked
                                     : PageClass::kPrivateAnonymous;
    if (rank(c) > rank(worst)) worst = c;
    cursor = std::max(cursor, m.hi);
    return cursor < hi;
  }, method);
  if (!read) return PageClass::kUnknown;
  if (worst == PageClass::kUnmapped || cursor < hi) return PageClass::kUnmapped;
  return worst;
}

}  // namespace lazypin
