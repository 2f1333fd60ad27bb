// simcuda_spy_app.cc: run with LD_PRELOAD=<simcuda_spy>; checks that the
// runtime's driver calls went through dlsym("cuGetProcAddress_v2") and the
// getter. Exit 0 = ok, 1 = wrong path, 77 = spy not preloaded.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

int main() {
  using Count = int (*)(const char*);
  auto count = reinterpret_cast<Count>(dlsym(RTLD_DEFAULT, "simcuda_spy_count"));
  auto dump = reinterpret_cast<void (*)()>(dlsym(RTLD_DEFAULT, "simcuda_spy_dump"));
  if (!count) return 77;
  static char buf[1 << 16];
  if (cudaHostRegister(buf, sizeof buf, 0) != cudaSuccess) return 2;
  if (cudaHostRegister(buf, sizeof buf, 0) != cudaErrorHostMemoryAlreadyRegistered) return 3;
  if (cudaHostUnregister(buf) != cudaSuccess) return 4;
  struct Want {
    const char* key;
    int n;
  } want[] = {
      {"dlsym cuGetProcAddress_v2", 1},   {"gpa cuGetProcAddress 11030", 1},
      {"gpa cuGetProcAddress 12000", 1},  {"gpa cuMemHostRegister 6050", 1},
      {"gpa cuMemHostUnregister 4000", 1}, {"gpa cuPointerGetAttribute 4000", 1},
      {"gpa cuPointerGetAttributes 7000", 1}, {"gpa cuInit 2000", 1},
      {"call cuMemHostRegister", 2},      {"call cuMemHostUnregister", 1},
  };
  int bad = 0;
  for (const auto& w : want) {
    int got = count(w.key);
    if (got != w.n) {
      std::fprintf(stderr, "spy_app: '%s' seen %d times, want %d\n", w.key, got, w.n);
      bad = 1;
    }
  }
  if (bad && dump) dump();
  if (!bad) std::printf("SIMCUDA_SPY_APP_OK\n");
  return bad;
}
