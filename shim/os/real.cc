// real: resolution of the real functions (see real.h).
#include "real.h"

#include <dlfcn.h>
#include <link.h>
#include <string.h>

namespace lazypin {
namespace real {
namespace {
thread_local int t_resolving __attribute__((tls_model("initial-exec"))) = 0;
}  // namespace

ScopedResolving::ScopedResolving() { ++t_resolving; }
ScopedResolving::~ScopedResolving() { --t_resolving; }
bool Resolving() { return t_resolving > 0; }

DlsymFn Dlsym() {
  static std::atomic<DlsymFn> fn{nullptr};
  DlsymFn f = fn.load(std::memory_order_relaxed);
  if (f == nullptr) {
    f = reinterpret_cast<DlsymFn>(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34"));
    if (f == nullptr) f = reinterpret_cast<DlsymFn>(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5"));
    fn.store(f, std::memory_order_relaxed);
  }
  return f;
}

void* Next(const char* name) {
  DlsymFn d = Dlsym();
  return d == nullptr ? nullptr : d(RTLD_NEXT, name);
}

void* Driver(const char* name) {
  static std::atomic<void*> handle{nullptr};
  void* h = handle.load(std::memory_order_acquire);
  if (h == nullptr) {
    h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (h == nullptr) return nullptr;  // not loaded (yet): try again next time
    handle.store(h, std::memory_order_release);
  }
  DlsymFn d = Dlsym();
  return d == nullptr ? nullptr : d(h, name);
}

void* Runtime(const char* name) {
  if (void* fn = Next(name)) return fn;
  struct Search {
    const char* name;
    void* found;
  } search{name, nullptr};
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, size_t, void* data) -> int {
        auto* s = static_cast<Search*>(data);
        const char* path = info->dlpi_name;
        if (path == nullptr) return 0;
        const char* base = strrchr(path, '/');
        base = base == nullptr ? path : base + 1;
        if (strncmp(base, "libcudart.so", 12) != 0) return 0;
        void* h = dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
        if (h == nullptr) return 0;
        DlsymFn d = Dlsym();
        s->found = d == nullptr ? nullptr : d(h, s->name);
        dlclose(h);  // drops only the reference NOLOAD took
        return s->found != nullptr ? 1 : 0;
      },
      &search);
  return search.found;
}

}  // namespace real
}  // namespace lazypin
