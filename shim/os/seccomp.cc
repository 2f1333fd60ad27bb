// seccomp: is a filter in force (see seccomp.h).
#include "seccomp.h"

#include <string.h>

#include <atomic>
#include <cstdio>

#include "sys.h"

namespace lazypin {
namespace {

std::atomic<bool> g_seen{false};
std::atomic<bool> g_noticed{false};

// The calling thread's status into buf; false when it cannot be read.
bool ReadStatus(char* buf, size_t size) {
  return ReadSmallFile("/proc/thread-self/status", buf, size) ||
         ReadSmallFile("/proc/self/status", buf, size);  // before Linux 3.17
}

// The value after "\n<field>:", or null.
const char* Field(const char* status, const char* field) {
  char key[32];
  snprintf(key, sizeof key, "\n%s:", field);
  const char* at = strstr(status, key);
  if (at == nullptr) return nullptr;
  at += strlen(key);
  while (*at == ' ' || *at == '\t') ++at;
  return at;
}

}  // namespace

bool SeccompFiltered() {
  if (g_seen.load(std::memory_order_relaxed)) return true;
  char status[4096];
  bool filtered = true;
  if (ReadStatus(status, sizeof status)) {
    const char* mode = Field(status, "Seccomp");
    filtered = mode != nullptr && *mode != '0';  // no field: a kernel without seccomp
  }
  if (filtered) g_seen.store(true, std::memory_order_relaxed);
  return filtered;
}

bool SeccompFilterSeen() { return g_seen.load(std::memory_order_relaxed); }

bool TakeSeccompNotice() {
  return g_seen.load(std::memory_order_relaxed) &&
         !g_noticed.exchange(true, std::memory_order_relaxed);
}

std::string SeccompStatusText() {
  char status[4096];
  if (!ReadStatus(status, sizeof status)) return "status unreadable";
  std::string out;
  for (const char* field : {"Seccomp", "Seccomp_filters"}) {
    const char* value = Field(status, field);
    if (value == nullptr) continue;
    if (!out.empty()) out += ", ";
    out += field;
    out += ": ";
    out.append(value, strcspn(value, "\n"));
  }
  return out.empty() ? "no seccomp fields" : out;
}

}  // namespace lazypin
