// memory_limit: the machine's memory, the cgroup's limit and the headroom (see memory_limit.h).
#include "memory_limit.h"

#include "thread_state.h"

#include <fcntl.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <initializer_list>

namespace lazypin {
namespace {

// The first number in `fd`'s text after `key` (or at the start when `key` is
// null); -1 when unreadable or not a number ("max"). Allocates nothing.
int64_t ReadNumber(int fd, const char* key) {
  if (fd < 0) return -1;
  char buf[2048];
  const ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return -1;
  buf[n] = '\0';
  const char* p = buf;
  if (key != nullptr) {
    p = strstr(buf, key);
    if (p == nullptr) return -1;
    p += strlen(key);
    while (*p == ' ') ++p;
  }
  if (*p < '0' || *p > '9') return -1;
  int64_t v = 0;
  for (; *p >= '0' && *p <= '9' && v < (INT64_MAX / 10 - 10); ++p) v = v * 10 + (*p - '0');
  return v;
}

int64_t ReadPath(const char* path) {
  if (path[0] == '\0') return -1;
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  const int64_t v = ReadNumber(fd, nullptr);
  if (fd >= 0) close(fd);
  return v;
}

}  // namespace

uint64_t MemoryForPercentages() { return MemoryProbe(false).Limit(); }

MemoryProbe::MemoryProbe(bool open_files) {
  char text[2048];
  const int fd = open("/proc/self/cgroup", O_RDONLY | O_CLOEXEC);
  const ssize_t n = fd >= 0 ? read(fd, text, sizeof(text) - 1) : -1;
  if (fd >= 0) close(fd);
  if (n > 0) {
    text[n] = '\0';
    // One line per hierarchy, "id:controllers:/path": the v1 memory
    // controller's if there is one (hybrid set-ups), else v2's "0::/path".
    for (char* line = text; line != nullptr && *line != '\0';) {
      char* next = strchr(line, '\n');
      if (next != nullptr) *next++ = '\0';
      const char* colon = strchr(line, ':');
      const char* controllers = colon != nullptr ? colon + 1 : nullptr;
      const char* rest = controllers != nullptr ? strchr(controllers, ':') : nullptr;
      if (rest != nullptr && strncmp(controllers, "memory:", 7) == 0) {
        snprintf(limit_path_, sizeof(limit_path_), "/sys/fs/cgroup/memory%s/memory.limit_in_bytes",
                 rest + 1);
        snprintf(usage_path_, sizeof(usage_path_), "/sys/fs/cgroup/memory%s/memory.usage_in_bytes",
                 rest + 1);
        break;
      }
      if (rest != nullptr && rest == controllers && line[0] == '0') {
        snprintf(limit_path_, sizeof(limit_path_), "/sys/fs/cgroup%s/memory.max", rest + 1);
        snprintf(usage_path_, sizeof(usage_path_), "/sys/fs/cgroup%s/memory.current", rest + 1);
      }
      line = next;
    }
  }
  if (open_files) {
    held_ = true;
    // The cgroup's files only under a limit ("max": none), statm only under
    // an address-space limit (or once a program thread meets one: Headroom).
    if (limit_path_[0] != '\0' && ReadPath(limit_path_) <= 0) limit_path_[0] = usage_path_[0] = '\0';
    if (limit_path_[0] != '\0') {
      limit_fd_.Hold(open(limit_path_, O_RDONLY | O_CLOEXEC));
      usage_fd_.Hold(open(usage_path_, O_RDONLY | O_CLOEXEC));
      if (limit_fd_.get() < 0 || usage_fd_.get() < 0) {
        limit_fd_.Close();
        usage_fd_.Close();
        limit_path_[0] = usage_path_[0] = '\0';
      }
    }
    meminfo_fd_.Hold(open("/proc/meminfo", O_RDONLY | O_CLOEXEC));
    if (AddressSpaceLimited()) OpenStatm();
  }
}

bool MemoryProbe::AddressSpaceLimited() {
  struct rlimit as, data;
  return (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) ||
         (getrlimit(RLIMIT_DATA, &data) == 0 && data.rlim_cur != RLIM_INFINITY);
}

void MemoryProbe::OpenStatm() const {
  if (statm_opened_.exchange(true, std::memory_order_acq_rel)) return;
  statm_fd_.Hold(open("/proc/self/statm", O_RDONLY | O_CLOEXEC));
}

MemoryProbe::MemoryProbe(const char* limit_path, const char* usage_path,
                         const char* meminfo_path) {
  snprintf(limit_path_, sizeof(limit_path_), "%s", limit_path);
  snprintf(usage_path_, sizeof(usage_path_), "%s", usage_path);
  if (limit_path[0] != '\0') limit_fd_.Hold(open(limit_path, O_RDONLY | O_CLOEXEC));
  if (usage_path[0] != '\0') usage_fd_.Hold(open(usage_path, O_RDONLY | O_CLOEXEC));
  snprintf(meminfo_path_, sizeof(meminfo_path_), "%s", "");
  if (meminfo_path[0] != '\0') meminfo_fd_.Hold(open(meminfo_path, O_RDONLY | O_CLOEXEC));
}

MemoryProbe::~MemoryProbe() {
  for (HeldFd* fd : {&limit_fd_, &usage_fd_, &meminfo_fd_, &statm_fd_}) fd->Close();
}

uint64_t MemoryProbe::Limit() const {
  const uint64_t ram = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                       static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const int64_t limit =
      limit_fd_.Ours() ? ReadNumber(limit_fd_.get(), nullptr) : ReadPath(limit_path_);
  return limit > 0 && static_cast<uint64_t>(limit) < ram ? static_cast<uint64_t>(limit) : ram;
}

namespace {

// A held file's number after `key`: -1 when unreadable; *lost when the file
// was held and the program took its descriptor over.
int64_t ReadHeld(HeldFd& fd, const char* key, bool* lost) {
  const bool had = fd.get() >= 0;
  if (fd.Ours()) return ReadNumber(fd.get(), key);
  if (had) *lost = true;
  return -1;
}

// rlim_cur of `resource` less `used` bytes; INT64_MAX without a limit.
int64_t RlimitLeft(int resource, int64_t used) {
  struct rlimit limit;
  if (used < 0 || getrlimit(resource, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY ||
      limit.rlim_cur > static_cast<rlim_t>(INT64_MAX)) {
    return INT64_MAX;
  }
  return static_cast<int64_t>(limit.rlim_cur) - used;
}

// statm's `index`th field (0: size, 5: data), in bytes; -1 when unreadable.
int64_t StatmBytes(int fd, int index) {
  if (fd < 0) return -1;
  char buf[256];
  const ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return -1;
  buf[n] = '\0';
  const char* p = buf;
  for (int i = 0; i < index; ++i) {
    p = strchr(p, ' ');
    if (p == nullptr) return -1;
    ++p;
  }
  int64_t pages = 0;
  for (; *p >= '0' && *p <= '9'; ++p) pages = pages * 10 + (*p - '0');
  return pages * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace

int64_t MemoryProbe::Headroom() const {
  // Read from the free hook (a block kept): errno is the program's.
  const int saved_errno = errno;
  int64_t headroom = INT64_MAX;
  bool lost = false;
  const int64_t limit = ReadHeld(limit_fd_, nullptr, &lost);  // -1: "max", no limit
  if (limit > 0) {
    const int64_t usage = ReadHeld(usage_fd_, nullptr, &lost);
    if (usage >= 0) headroom = limit - usage;
  }
  const int64_t available_kb = ReadHeld(meminfo_fd_, "MemAvailable:", &lost);
  if (available_kb >= 0 && available_kb < INT64_MAX / 1024) {
    headroom = std::min(headroom, available_kb * 1024);
  }
  struct rlimit as, data;
  const bool as_set = getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY;
  const bool data_set = getrlimit(RLIMIT_DATA, &data) == 0 && data.rlim_cur != RLIM_INFINITY;
  // A limit set since construction: statm is opened here on a program
  // thread (never lazypin's own: a descriptor it opens could be, for that
  // moment, the lowest free one the program's open() should get).
  if ((as_set || data_set) && held_ && !t_own_thread) OpenStatm();
  if ((as_set || data_set) && statm_fd_.get() >= 0) {
    if (!statm_fd_.Ours()) {
      lost = true;
    } else {
      if (as_set) headroom = std::min(headroom, RlimitLeft(RLIMIT_AS, StatmBytes(statm_fd_.get(), 0)));
      if (data_set) {
        headroom = std::min(headroom, RlimitLeft(RLIMIT_DATA, StatmBytes(statm_fd_.get(), 5)));
      }
    }
  }
  errno = saved_errno;
  return lost && held_ ? 0 : headroom;
}

}  // namespace lazypin
