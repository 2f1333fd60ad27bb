// memory_limit: the machine's memory or the cgroup's limit (see memory_limit.h).
#include "memory_limit.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "sys.h"

namespace lazypin {
namespace {

// `path`'s first line as a number of bytes; 0 when unreadable or "max".
uint64_t ReadLimit(const char* path) {
  char buf[64];
  if (!ReadSmallFile(path, buf, sizeof buf)) return 0;
  uint64_t v = 0;
  for (const char* c = buf; *c >= '0' && *c <= '9'; ++c) v = v * 10 + (*c - '0');
  return v;
}

}  // namespace

uint64_t MemoryForPercentages() {
  const uint64_t ram = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                       static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  char text[2048];
  if (!ReadSmallFile("/proc/self/cgroup", text, sizeof text)) return ram;
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

}  // namespace lazypin
