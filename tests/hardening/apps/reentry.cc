// reentry.cc: lazypin's hooks entered from unusual places.
//
//   reentry signal [--seconds 2]  a SIGALRM handler (setitimer, 200 us) frees
//        buffers that the main loop registered, copied and unregistered (so
//        lazypin pools them) while the main loop keeps registering, copying and
//        unregistering new ones. The main loop blocks SIGALRM around its own
//        malloc/free, and the buffers are mmap'd chunks (M_MMAP_THRESHOLD
//        64 KiB; heap chunks are freed by the loop itself), so glibc's free in
//        the handler takes no lock the program holds.
//        A handler free that lazypin fails to invalidate leaves the old
//        registration in the driver: the next buffer at that address then gets
//        712 or a stale copy (the simulated driver aborts). --block-cuda also
//        blocks SIGALRM around cudaHostRegister/Unregister (the control case:
//        the handler then never interrupts lazypin itself).
//   reentry atexit   late free of pooled memory from atexit handlers, one that
//        runs before lazypin's own exit handler and one after it; the late one
//        then allocates again and registers / copies / unregisters.
//   reentry dtor     the same from a static object's destructor.
//   reentry dlopen LIB   dlopen a library that registers/unregisters/copies
//        (tests/hardening/apps/cudalib.cc), call it, dlclose, 20 times.
//   reentry rtldnext  the program calls free through dlsym(RTLD_NEXT, "free")
//        on pooled memory, then reuses the address.
// Prints what it saw (codes), ending with "<MODE> ok". Exit 0 ok, 2 data
// mismatch, 3 unexpected code.
#include "hcommon.h"

#include <dlfcn.h>
#include <malloc.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/time.h>

#include <atomic>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

namespace {

const size_t kBig = 1 << 20;
void* g_dev = nullptr;
unsigned char* g_check = nullptr;

// Register, copy+verify, unregister: the buffer ends up pooled under defer.
// With `shield` (a signal set), the copies run with those signals blocked:
// the handler may then interrupt lazypin's own code, never the driver's
// (a handler that unmaps pooled memory inside the driver is a known limit).
void cycle(unsigned char* p, size_t n, unsigned seed, const char* tag, bool print,
           const sigset_t* shield = nullptr) {
  int r1 = cudaHostRegister(p, n, 0);
  if (shield != nullptr) sigprocmask(SIG_BLOCK, shield, nullptr);
  if (r1 == 0) hard::roundtrip(p, n, g_dev, g_check, seed);
  if (shield != nullptr) sigprocmask(SIG_UNBLOCK, shield, nullptr);
  int r2 = cudaHostUnregister(p);
  cudaGetLastError();
  if (print) std::printf("%s register=%d unregister=%d\n", tag, r1, r2);
  else {
    hard::expect(r1, 0, tag, __LINE__);
    hard::expect(r2, 0, tag, __LINE__);
  }
}

void setup_cuda() {
  EXPECT(cudaMalloc(&g_dev, kBig), 0);
  g_check = static_cast<unsigned char*>(std::malloc(kBig));
}

// ------------------------------------------------------------------ signal --
const int kSlots = 64;
std::atomic<void*> g_slots[kSlots];
std::atomic<unsigned long> g_signals{0}, g_handler_frees{0};

// --madvise: the handler drops the pages of a pooled mmap'd buffer
// (MADV_DONTNEED: zero pages from then on) instead of freeing it, and hands it
// back; the main loop registers it again, copies and checks the bytes. When
// the handler interrupted lazypin's own code, no hook can act then: the
// kernel watch must see it, or the register hits and DMAs from the old pages.
bool g_madvise = false;
const size_t kMadviseBytes = 128 * 1024;
std::atomic<void*> g_dropped[kSlots];

void on_alarm(int) {
  int saved = errno;
  g_signals++;
  for (int i = 0; i < kSlots; ++i) {
    void* p = g_slots[i].exchange(nullptr);
    if (!p) continue;
    if (g_madvise) {
      madvise(p, kMadviseBytes, MADV_DONTNEED);
      for (int j = 0; j < kSlots; ++j) {
        void* expected = nullptr;
        if (g_dropped[j].compare_exchange_strong(expected, p)) break;
      }
    } else {
      std::free(p);
    }
    g_handler_frees++;
    break;
  }
  errno = saved;
}

// glibc's chunk header: bit 1 of the size word before the block is IS_MMAPPED.
bool glibc_mmapped_chunk(const void* p) {
  return (static_cast<const size_t*>(p)[-1] & 2) != 0;
}

// --block-cuda: SIGALRM is also blocked around the register/unregister calls,
// so the handler never interrupts lazypin's own code (the control case).
bool g_block_cuda = false;

int run_signal(double seconds) {
  mallopt(M_MMAP_THRESHOLD, 64 * 1024);
  setup_cuda();
  sigset_t alrm;
  sigemptyset(&alrm);
  sigaddset(&alrm, SIGALRM);
  struct sigaction sa = {};
  sa.sa_handler = on_alarm;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGALRM, &sa, nullptr);
  struct itimerval it = {{0, 200}, {0, 200}};
  setitimer(ITIMER_REAL, &it, nullptr);
  unsigned long loops = 0;
  const double deadline = hard::now_s() + seconds;
  while (hard::now_s() < deadline && g_madvise) {
    // A buffer whose pages the handler dropped: registered again (the same
    // base and size as the pooled registration), copied, checked, unmapped.
    for (int i = 0; i < kSlots; ++i) {
      if (auto* q = static_cast<unsigned char*>(g_dropped[i].exchange(nullptr))) {
        cycle(q, kMadviseBytes, static_cast<unsigned>(loops) + 7, "madvise-reuse", false, &alrm);
        munmap(q, kMadviseBytes);
      }
    }
    void* m = mmap(nullptr, kMadviseBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    auto* p = static_cast<unsigned char*>(m);
    cycle(p, kMadviseBytes, static_cast<unsigned>(loops), "madvise-loop", false, &alrm);
    bool queued = false;
    for (int i = 0; i < kSlots && !queued; ++i) {
      void* expected = nullptr;
      queued = g_slots[i].compare_exchange_strong(expected, p);
    }
    if (!queued) munmap(p, kMadviseBytes);
    ++loops;
  }
  while (hard::now_s() < deadline) {
    const size_t n = (64 + (loops % 4) * 32) * 1024;  // 64-160 KiB: mmap'd chunks
    sigprocmask(SIG_BLOCK, &alrm, nullptr);
    auto* p = static_cast<unsigned char*>(std::malloc(n));
    sigprocmask(SIG_UNBLOCK, &alrm, nullptr);
    if (g_block_cuda) {
      sigprocmask(SIG_BLOCK, &alrm, nullptr);
      EXPECT(cudaHostRegister(p, n, 0), 0);
      sigprocmask(SIG_UNBLOCK, &alrm, nullptr);
      hard::roundtrip(p, n, g_dev, g_check, static_cast<unsigned>(loops));
      sigprocmask(SIG_BLOCK, &alrm, nullptr);
      EXPECT(cudaHostUnregister(p), 0);
      sigprocmask(SIG_UNBLOCK, &alrm, nullptr);
    } else {
      cycle(p, n, static_cast<unsigned>(loops), "signal-loop", false);
    }
    // Only mmap'd chunks go to the handler: glibc serves even large requests
    // from free heap memory when it has some, and a handler's free of a heap
    // chunk that interrupts malloc deadlocks in glibc itself.
    bool queued = false;
    for (int i = 0; i < kSlots && !queued && glibc_mmapped_chunk(p); ++i) {
      void* expected = nullptr;
      queued = g_slots[i].compare_exchange_strong(expected, p);
    }
    if (!queued) {
      sigprocmask(SIG_BLOCK, &alrm, nullptr);
      std::free(p);
      sigprocmask(SIG_UNBLOCK, &alrm, nullptr);
    }
    ++loops;
  }
  struct itimerval off = {};
  setitimer(ITIMER_REAL, &off, nullptr);
  std::printf("SIGNAL loops=%lu signals=%lu handler_frees=%lu ok\n", loops, g_signals.load(),
              g_handler_frees.load());
  return 0;
}

// ------------------------------------------------------- atexit and dtors --
unsigned char* g_late_malloc = nullptr;
unsigned char* g_late_map = nullptr;
unsigned char* g_early = nullptr;

void late_reuse(const char* who) {
  // malloc'd (mmap'd chunk): free, malloc again, register/copy/unregister.
  std::free(g_late_malloc);
  auto* p = static_cast<unsigned char*>(std::malloc(kBig));
  cycle(p, kBig, 11, who, true);
  std::free(p);
  // mmap'd: munmap, map again at the same address, register/copy/unregister.
  munmap(g_late_map, kBig);
  void* m = mmap(g_late_map, kBig, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  std::printf("%s remap_same_address=%d\n", who, m == g_late_map);
  if (m != MAP_FAILED) {
    cycle(static_cast<unsigned char*>(m), kBig, 12, who, true);
    munmap(m, kBig);
  }
  std::fflush(stdout);
}

void late_atexit() { late_reuse("late-atexit"); }
void early_atexit() {  // registered after the first CUDA call: runs before lazypin's handler
  std::free(g_early);
  std::printf("early-atexit freed\n");
}

void make_pooled() {
  setup_cuda();
  g_late_malloc = static_cast<unsigned char*>(std::malloc(kBig));
  cycle(g_late_malloc, kBig, 1, "pool-malloc", true);
  void* m = mmap(nullptr, kBig, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  g_late_map = static_cast<unsigned char*>(m);
  cycle(g_late_map, kBig, 2, "pool-mmap", true);
  g_early = static_cast<unsigned char*>(std::malloc(kBig));
  cycle(g_early, kBig, 3, "pool-early", true);
}

struct LateDtor {
  bool armed = false;
  ~LateDtor() {
    if (armed) late_reuse("static-dtor");
  }
};

// Constructed before main, so destroyed after everything else, the simulated
// driver's own state included: it only frees (pooled) memory, no CUDA.
unsigned char* g_very_late = nullptr;
struct VeryLateDtor {
  ~VeryLateDtor() {
    std::free(g_very_late);
    std::printf("very-late static dtor freed\n");
  }
} g_very_late_dtor;

void pool_very_late() {
  g_very_late = static_cast<unsigned char*>(std::malloc(kBig));
  cycle(g_very_late, kBig, 4, "pool-very-late", true);
}

// CUDA is initialised first (cudaFree(0)), so the driver outlives the handlers
// registered next; lazypin installs its own exit handler at the first
// registration, after them, so it runs BEFORE them: they free pooled memory
// after lazypin's teardown, then allocate at the same address and register.
int run_atexit() {
  EXPECT(cudaFree(nullptr), 0);
  atexit(late_atexit);
  make_pooled();
  pool_very_late();
  atexit(early_atexit);
  std::printf("ATEXIT main done\n");
  return 0;
}

int run_dtor() {
  EXPECT(cudaFree(nullptr), 0);
  static LateDtor late;  // destroyed after lazypin's exit handler, before the driver's
  late.armed = true;
  make_pooled();
  pool_very_late();
  atexit(early_atexit);
  std::printf("DTOR main done\n");
  return 0;
}

// ------------------------------------------------------------------ dlopen --
int run_dlopen(const char* lib) {
  setup_cuda();
  auto* mine = static_cast<unsigned char*>(std::malloc(kBig));
  cycle(mine, kBig, 5, "main-before", true);
  for (int i = 0; i < 20; ++i) {
    void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      std::fprintf(stderr, "dlopen: %s\n", dlerror());
      return 1;
    }
    auto fn = reinterpret_cast<int (*)(int)>(dlsym(h, "cudalib_cycle"));
    if (!fn) {
      std::fprintf(stderr, "dlsym cudalib_cycle: %s\n", dlerror());
      return 1;
    }
    int rc = fn(8);
    if (i == 0 || rc != 0) std::printf("cudalib_cycle -> %d\n", rc);
    if (rc != 0) return 3;
    dlclose(h);  // the library's static destructor frees its pooled buffer
  }
  std::free(mine);
  auto* again = static_cast<unsigned char*>(std::malloc(kBig));
  cycle(again, kBig, 6, "main-after", true);
  std::free(again);
  std::printf("DLOPEN rounds=20 ok\n");
  return 0;
}

// ---------------------------------------------------------------- rtldnext --
int run_rtldnext() {
  setup_cuda();
  auto next_free = reinterpret_cast<void (*)(void*)>(dlsym(RTLD_NEXT, "free"));
  if (!next_free) {
    std::fprintf(stderr, "dlsym(RTLD_NEXT, free) failed\n");
    return 1;
  }
  for (int i = 0; i < 50; ++i) {
    auto* p = static_cast<unsigned char*>(std::malloc(kBig));
    cycle(p, kBig, static_cast<unsigned>(i), "rtldnext", i == 0);
    next_free(p);
  }
  std::printf("RTLDNEXT rounds=50 ok\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  g_block_cuda = hard::arg_flag(argc, argv, "--block-cuda");
  if (!std::strcmp(mode, "signal")) {
    for (int i = 2; i < argc; ++i) g_madvise = g_madvise || !std::strcmp(argv[i], "--madvise");
    return run_signal(hard::arg_double(argc, argv, "--seconds", 2));
  }
  if (!std::strcmp(mode, "atexit")) return run_atexit();
  if (!std::strcmp(mode, "dtor")) return run_dtor();
  if (!std::strcmp(mode, "dlopen") && argc > 2) return run_dlopen(argv[2]);
  if (!std::strcmp(mode, "rtldnext")) return run_rtldnext();
  std::fprintf(stderr, "usage: reentry signal [--seconds S] | atexit | dtor | dlopen LIB | rtldnext\n");
  return 1;
}
