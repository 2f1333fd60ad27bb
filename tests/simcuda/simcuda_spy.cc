// simcuda_spy.cc: a tiny LD_PRELOAD library that intercepts dlsym and wraps
// cuGetProcAddress_v2 the way the lazypin shim does. It records every lookup
// so a test can verify that the sim runtime reaches the driver through
// dlopen + dlsym("cuGetProcAddress_v2") + the getter, like the real cudart.
#include <cuda.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#undef cuGetProcAddress

namespace {
using Dlsym = void* (*)(void*, const char*);
using Getter = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
using RegFn = CUresult (*)(void*, size_t, unsigned);
using UnregFn = CUresult (*)(void*);

std::mutex mu;
std::vector<std::string>* log_ = nullptr;
Getter real_gpa_dlsym = nullptr;  // from dlsym
Getter real_gpa = nullptr;        // from the getter itself (12000)
RegFn real_reg = nullptr;
UnregFn real_unreg = nullptr;

void note(const std::string& s) {
  std::lock_guard<std::mutex> l(mu);
  if (!log_) log_ = new std::vector<std::string>;
  log_->push_back(s);
}

Dlsym real_dlsym() {
  static Dlsym d = [] {
    void* p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!p) p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    return reinterpret_cast<Dlsym>(p);
  }();
  return d;
}

CUresult spy_reg(void* p, size_t n, unsigned f) {
  note("call cuMemHostRegister");
  return real_reg(p, n, f);
}
CUresult spy_unreg(void* p) {
  note("call cuMemHostUnregister");
  return real_unreg(p);
}

CUresult spy_gpa(const char* sym, void** pfn, int ver, cuuint64_t flags,
                 CUdriverProcAddressQueryResult* st) {
  Getter real = real_gpa ? real_gpa : real_gpa_dlsym;
  CUresult rc = real(sym, pfn, ver, flags, st);
  note("gpa " + std::string(sym) + " " + std::to_string(ver));
  if (rc != CUDA_SUCCESS || !pfn || !*pfn) return rc;
  if (std::strcmp(sym, "cuGetProcAddress") == 0 && ver >= 12000) {
    real_gpa = reinterpret_cast<Getter>(*pfn);
    *pfn = reinterpret_cast<void*>(&spy_gpa);
  } else if (std::strcmp(sym, "cuMemHostRegister") == 0) {
    real_reg = reinterpret_cast<RegFn>(*pfn);
    *pfn = reinterpret_cast<void*>(&spy_reg);
  } else if (std::strcmp(sym, "cuMemHostUnregister") == 0) {
    real_unreg = reinterpret_cast<UnregFn>(*pfn);
    *pfn = reinterpret_cast<void*>(&spy_unreg);
  }
  return rc;
}
}  // namespace

extern "C" void* dlsym(void* handle, const char* name) {
  void* r = real_dlsym()(handle, name);
  if (r && name && std::strcmp(name, "cuGetProcAddress_v2") == 0) {
    note("dlsym cuGetProcAddress_v2");
    real_gpa_dlsym = reinterpret_cast<Getter>(r);
    return reinterpret_cast<void*>(&spy_gpa);
  }
  return r;
}

// Number of log entries equal to `key`.
extern "C" int simcuda_spy_count(const char* key) {
  std::lock_guard<std::mutex> l(mu);
  int n = 0;
  if (log_)
    for (const auto& s : *log_) n += (s == key);
  return n;
}

extern "C" void simcuda_spy_dump(void) {
  std::lock_guard<std::mutex> l(mu);
  if (log_)
    for (const auto& s : *log_) std::fprintf(stderr, "spy: %s\n", s.c_str());
}
