// reuse: the allocate/pin/unpin/free cycle (PyTorch's pinned
// allocator with pinned_use_cuda_host_register, checkpoint loaders): malloc,
// fill, cudaHostRegister, copy to the device and back, cudaHostUnregister,
// free, again. Knows nothing of lazypin; every line it prints but RESULT is
// the same with and without it (the tests compare them).
//
//   reuse --mode cycle --sizes 4K,1M,4M --iters 20   the cycle; RESULT median per size
//   reuse --mode kept ...                             the fill and copy alone, from a
//                                                     block kept registered (the target)
//   reuse --mode calloc|align|usable|realloc|pageable|signal|threads|fork|idle|zeroed
//         allocator semantics around the cycle (see each mode below)
//
// A block of 128 KiB to 32 MiB is mmapped by glibc until the first free of
// one raises its threshold (glibc's dynamic mmap threshold); blocks of that
// size come from the heap after it. So such a cycle's first block never
// comes back: its second does.
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <atomic>
#include <thread>

#include "common.h"

namespace {

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "reuse: %s\n", msg.c_str());
  std::exit(1);
}

void* g_device = nullptr;
size_t g_device_bytes = 0;

// The whole block written, as a real client fills it (and as a fresh
// block's pages are first touched), with a pattern that differs per seed.
void Fill(void* p, size_t n, unsigned seed) {
  auto* b = static_cast<unsigned char*>(p);
  memset(b, static_cast<int>(seed & 0xff), n);
  for (size_t i = 0; i < n; i += 4096) b[i] = static_cast<unsigned char>(seed + i / 4096);
  b[n - 1] = static_cast<unsigned char>(seed ^ 0x5a);
}

void EnsureDevice(size_t n) {
  if (g_device_bytes >= n) return;
  if (g_device != nullptr) CHECK(cudaFree(g_device));
  CHECK(cudaMalloc(&g_device, n));
  g_device_bytes = n;
}

// The device copy back into a pageable buffer equals p (not timed).
bool Verify(const void* p, size_t n) {
  std::vector<unsigned char> back(n);
  CHECK(cudaMemcpy(back.data(), g_device, n, cudaMemcpyDeviceToHost));
  return memcmp(back.data(), p, n) == 0;
}

// Copies p to the device and checks it came back.
bool RoundTrip(const void* p, size_t n) {
  EnsureDevice(n);
  CHECK(cudaMemcpy(g_device, p, n, cudaMemcpyHostToDevice));
  return Verify(p, n);
}

// One cycle on a block from `alloc`: allocate, fill, register, copy to the
// device, unregister, free. `us` gets its time, the check of the copy left
// out. False if the bytes did not come back.
template <typename Alloc>
bool Cycle(size_t n, unsigned seed, Alloc alloc, double* us = nullptr) {
  EnsureDevice(n);
  const double t0 = tapp::now_us();
  void* p = alloc(n);
  if (p == nullptr) return false;
  Fill(p, n, seed);
  CHECK(cudaHostRegister(p, n, cudaHostRegisterDefault));
  CHECK(cudaMemcpy(g_device, p, n, cudaMemcpyHostToDevice));
  const double t1 = tapp::now_us();
  const bool ok = Verify(p, n);
  const double t2 = tapp::now_us();
  CHECK(cudaHostUnregister(p));
  free(p);
  if (us != nullptr) *us = (t1 - t0) + (tapp::now_us() - t2);
  return ok;
}

void* Malloc(size_t n) { return malloc(n); }

std::vector<size_t> Sizes(const tapp::Args& args, const char* def) {
  std::vector<size_t> out;
  std::string s = args.str("sizes", def);
  size_t at = 0;
  while (at <= s.size()) {
    size_t comma = s.find(',', at);
    if (comma == std::string::npos) comma = s.size();
    size_t v;
    if (!tapp::parse_size(s.substr(at, comma - at), &v)) Die("bad --sizes");
    out.push_back(v);
    at = comma + 1;
  }
  return out;
}

int ModeCycle(const tapp::Args& args) {
  const int iters = static_cast<int>(args.num("iters", 20));
  for (size_t n : Sizes(args, "4K,64K,1M,4M")) {
    std::vector<double> times;
    bool ok = true;
    for (int i = 0; i < iters; ++i) {
      double us;
      ok = Cycle(n, static_cast<unsigned>(i), Malloc, &us) && ok;
      times.push_back(us);
    }
    std::sort(times.begin(), times.end());
    std::printf("cycle size=%s iters=%d bytes=%s\n", tapp::size_name(n).c_str(), iters,
                ok ? "ok" : "WRONG");
    std::printf("RESULT mode=cycle size=%s median_us=%.1f min_us=%.1f\n", tapp::size_name(n).c_str(),
                times[times.size() / 2], times[0]);
  }
  return 0;
}

// The baseline: the same fill and copy from one block kept registered.
int ModeKept(const tapp::Args& args) {
  const int iters = static_cast<int>(args.num("iters", 20));
  for (size_t n : Sizes(args, "4K,64K,1M,4M")) {
    EnsureDevice(n);
    void* p = malloc(n);
    CHECK(cudaHostRegister(p, n, cudaHostRegisterDefault));
    std::vector<double> times;
    bool ok = true;
    for (int i = 0; i < iters; ++i) {
      const double t0 = tapp::now_us();
      Fill(p, n, static_cast<unsigned>(i));
      CHECK(cudaMemcpy(g_device, p, n, cudaMemcpyHostToDevice));
      times.push_back(tapp::now_us() - t0);
      ok = Verify(p, n) && ok;
    }
    CHECK(cudaHostUnregister(p));
    free(p);
    std::sort(times.begin(), times.end());
    std::printf("kept size=%s iters=%d bytes=%s\n", tapp::size_name(n).c_str(), iters,
                ok ? "ok" : "WRONG");
    std::printf("RESULT mode=kept size=%s median_us=%.1f min_us=%.1f\n", tapp::size_name(n).c_str(),
                times[times.size() / 2], times[0]);
  }
  return 0;
}

// calloc of a block that was registered, filled and freed: zero throughout
// its usable size, as glibc's calloc leaves it.
int ModeCalloc(const tapp::Args& args) {
  for (size_t n : Sizes(args, "64K,4M")) {
    bool zero = true;
    for (int i = 0; i < 4; ++i) {
      void* p = calloc(1, n);
      const size_t usable = malloc_usable_size(p);
      for (size_t k = 0; k < usable; ++k) zero = zero && static_cast<unsigned char*>(p)[k] == 0;
      memset(p, 0xab, usable);
      CHECK(cudaHostRegister(p, n, cudaHostRegisterDefault));
      CHECK(cudaHostUnregister(p));
      free(p);
    }
    std::printf("calloc size=%s zero=%s\n", tapp::size_name(n).c_str(), zero ? "yes" : "NO");
  }
  return 0;
}

// An mmapped block (glibc's threshold fixed below it) that comes back after
// a pause (--pause-ms): zero throughout its usable size, as a fresh mapping
// reads, every round (lazypin zeroes it while it is parked, or when it is
// served).
int ModeZeroed(const tapp::Args& args) {
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  const int iters = static_cast<int>(args.num("iters", 4));
  const auto pause = static_cast<useconds_t>(args.num("pause-ms", 0)) * 1000;
  for (size_t n : Sizes(args, "4M")) {
    bool zero = true, ok = true;
    for (int i = 0; i < iters; ++i) {
      auto* p = static_cast<unsigned char*>(malloc(n));
      const size_t usable = malloc_usable_size(p);
      for (size_t k = 0; k < usable; ++k) zero = zero && p[k] == 0;
      Fill(p, usable, static_cast<unsigned>(i));
      CHECK(cudaHostRegister(p, n, cudaHostRegisterDefault));
      ok = RoundTrip(p, n) && ok;
      CHECK(cudaHostUnregister(p));
      free(p);
      usleep(pause);
    }
    std::printf("zeroed size=%s iters=%d zero=%s bytes=%s\n", tapp::size_name(n).c_str(), iters,
                zero ? "yes" : "NO", ok ? "ok" : "WRONG");
  }
  return 0;
}

// Every aligned allocation function around the cycle: the alignment holds.
int ModeAlign(const tapp::Args&) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  struct Fn {
    const char* name;
    void* (*alloc)(size_t);
    size_t align;
  };
  const Fn fns[] = {
      {"posix_memalign4096", [](size_t n) { void* p = nullptr; return posix_memalign(&p, 4096, n) == 0 ? p : nullptr; }, 4096},
      {"posix_memalign64", [](size_t n) { void* p = nullptr; return posix_memalign(&p, 64, n) == 0 ? p : nullptr; }, 64},
      {"aligned_alloc4096", [](size_t n) { return aligned_alloc(4096, n); }, 4096},
      {"memalign256", [](size_t n) { return memalign(256, n); }, 256},
      {"valloc", [](size_t n) { return valloc(n); }, 4096},
      {"pvalloc", [](size_t n) { return pvalloc(n); }, 4096},
      {"realloc_null", [](size_t n) { return realloc(nullptr, n); }, 16},
      {"malloc", [](size_t n) { return malloc(n); }, 16},
  };
  for (const Fn& fn : fns) {
    bool aligned = true, ok = true;
    for (int i = 0; i < 4; ++i) {
      ok = Cycle(4 << 20, static_cast<unsigned>(i), [&](size_t n) {
             void* p = fn.alloc(n);
             aligned = aligned && reinterpret_cast<uintptr_t>(p) % fn.align == 0 &&
                       malloc_usable_size(p) >= n;
             return p;
           }) && ok;
    }
    (void)page;
    std::printf("align %s aligned=%s bytes=%s\n", fn.name, aligned ? "yes" : "NO", ok ? "ok" : "WRONG");
  }
  return 0;
}

// The usable size of every block of the cycle, which says where glibc put
// it (heap or mmapped): the same with and without lazypin, with glibc's
// dynamic mmap threshold (raised by the first free of each size) and with
// a fixed one (--fixed-threshold), where a served block's is also the one a
// fresh block of that request has at that moment.
int ModeUsable(const tapp::Args& args) {
  const bool fixed = args.has("fixed-threshold");
  if (fixed) mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  for (size_t n : Sizes(args, "200K,1M,4M")) {
    std::string seen;
    bool as_fresh = true;
    for (int i = 0; i < 4; ++i) {
      void* p = malloc(n);
      const size_t usable = malloc_usable_size(p);
      if (fixed) {
        void* fresh = malloc(n);  // a fresh one beside it (nothing else parked of that size)
        as_fresh = as_fresh && usable == malloc_usable_size(fresh);
        free(fresh);
      }
      seen += " " + std::to_string(usable);
      CHECK(cudaHostRegister(p, n, cudaHostRegisterDefault));
      CHECK(cudaHostUnregister(p));
      free(p);
    }
    std::printf("usable size=%s:%s as_fresh=%s\n", tapp::size_name(n).c_str(), seen.c_str(),
                as_fresh ? "yes" : "NO");
  }
  return 0;
}

// realloc of a block that came back: contents kept, the old block's
// registration gone before it moves.
int ModeRealloc(const tapp::Args&) {
  const size_t n = 4 << 20;
  bool ok = Cycle(n, 1, Malloc) && Cycle(n, 2, Malloc);
  void* p = malloc(n);
  Fill(p, n, 7);
  std::vector<unsigned char> copy(static_cast<unsigned char*>(p), static_cast<unsigned char*>(p) + n);
  p = realloc(p, 2 * n);
  ok = ok && memcmp(p, copy.data(), n) == 0;
  Fill(p, 2 * n, 9);
  CHECK(cudaHostRegister(p, 2 * n, cudaHostRegisterDefault));
  ok = ok && RoundTrip(p, 2 * n);
  CHECK(cudaHostUnregister(p));
  free(p);
  std::printf("realloc kept=%s\n", ok ? "yes" : "NO");
  return 0;
}

// A block that came back and is NOT registered is pageable to the program:
// an async copy from it takes the bytes as of the call, and a pointer query
// says it is not registered.
int ModePageable(const tapp::Args&) {
  const size_t n = 4 << 20;
  bool ok = Cycle(n, 1, Malloc) && Cycle(n, 2, Malloc);
  unsigned char* p = static_cast<unsigned char*>(malloc(n));
  memset(p, 0x11, n);
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  CHECK(cudaMemcpyAsync(g_device, p, n, cudaMemcpyHostToDevice, s));
  memset(p, 0x22, n);  // pageable: the copy already took 0x11
  CHECK(cudaStreamSynchronize(s));
  std::vector<unsigned char> back(n);
  CHECK(cudaMemcpy(back.data(), g_device, n, cudaMemcpyDeviceToHost));
  ok = ok && back[0] == 0x11 && back[n - 1] == 0x11;
  cudaPointerAttributes attr;
  const cudaError_t q = cudaPointerGetAttributes(&attr, p);
  std::printf("pageable copy=%s query=%d type=%d\n", ok ? "as-pageable" : "CHANGED", static_cast<int>(q),
              q == cudaSuccess ? static_cast<int>(attr.type) : -1);
  CHECK(cudaStreamDestroy(s));
  free(p);
  return 0;
}

void* g_signal_block = nullptr;
void FreeInHandler(int) { free(g_signal_block); }

// The program's free of a pooled block from a signal handler; then the cycle goes on.
int ModeSignal(const tapp::Args&) {
  signal(SIGUSR1, FreeInHandler);
  const size_t n = 4 << 20;
  bool ok = true;
  for (int i = 0; i < 4; ++i) {
    g_signal_block = malloc(n);
    Fill(g_signal_block, n, static_cast<unsigned>(i));
    CHECK(cudaHostRegister(g_signal_block, n, cudaHostRegisterDefault));
    ok = RoundTrip(g_signal_block, n) && ok;
    CHECK(cudaHostUnregister(g_signal_block));
    raise(SIGUSR1);
  }
  ok = Cycle(n, 9, Malloc) && ok;
  std::printf("signal bytes=%s\n", ok ? "ok" : "WRONG");
  return 0;
}

// Threads cycling at once, and blocks freed by a thread other than the one
// that allocated them.
int ModeThreads(const tapp::Args& args) {
  const int threads = static_cast<int>(args.num("threads", 4));
  std::atomic<int> bad{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([t, &bad] {
      CHECK(cudaSetDevice(0));
      const size_t n = size_t{1} << (20 + t % 3);
      for (int i = 0; i < 20; ++i) {
        void* p = malloc(n);
        Fill(p, n, static_cast<unsigned>(i + t));
        CHECK(cudaHostRegister(p, n, cudaHostRegisterDefault));
        void* d = nullptr;
        CHECK(cudaMalloc(&d, n));
        CHECK(cudaMemcpy(d, p, n, cudaMemcpyHostToDevice));
        std::vector<unsigned char> back(n);
        CHECK(cudaMemcpy(back.data(), d, n, cudaMemcpyDeviceToHost));
        if (memcmp(back.data(), p, n) != 0) bad++;
        CHECK(cudaFree(d));
        CHECK(cudaHostUnregister(p));
        std::thread([p] { free(p); }).join();  // freed by another thread
      }
    });
  }
  for (auto& th : pool) th.join();
  std::printf("threads=%d bytes=%s\n", threads, bad == 0 ? "ok" : "WRONG");
  return 0;
}

// A fork after a cycle: the child allocates the same size and runs the
// cycle on its own; the parent goes on.
int ModeFork(const tapp::Args&) {
  const size_t n = 4 << 20;
  bool ok = Cycle(n, 1, Malloc) && Cycle(n, 2, Malloc);
  fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    void* p = malloc(n);
    Fill(p, n, 3);
    std::vector<unsigned char> copy(static_cast<unsigned char*>(p), static_cast<unsigned char*>(p) + n);
    Fill(p, n, 4);
    const bool child_ok = memcmp(p, copy.data(), n) != 0;
    free(p);
    std::printf("fork child malloc=%s\n", child_ok ? "ok" : "WRONG");
    fflush(stdout);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ok = Cycle(n, 5, Malloc) && Cycle(n, 6, Malloc) && ok;
  std::printf("fork child_exit=%d parent bytes=%s\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1,
              ok ? "ok" : "WRONG");
  return 0;
}

// Address space for one big block more than the program holds: a block of
// another size must still be allocatable right after a big block was freed
// (under lazypin that block may be parked: the allocation has it released).
int ModeRoom(const tapp::Args& args) {
  const size_t n = 64 << 20, other = 80 << 20;
  // Every thread the run needs exists before the limit (a thread made under
  // it can find no room for its thread-local data: glibc aborts): lazypin's
  // start in the first call, and its first release (realloc of memory it
  // holds) in this context.
  void* warm = malloc(4096);
  CHECK(cudaHostRegister(warm, 4096, cudaHostRegisterDefault));
  CHECK(cudaHostUnregister(warm));
  warm = realloc(warm, 8192);
  free(warm);
  EnsureDevice(n);
  void* p = malloc(n);
  Fill(p, n, 1);
  CHECK(cudaHostRegister(p, n, cudaHostRegisterDefault));
  CHECK(cudaMemcpy(g_device, p, n, cudaMemcpyHostToDevice));
  // The limit: what the process maps now (the block included, and whatever
  // its register made) and `room-mib` more: the other block fits once this
  // one is gone, not beside it.
  long pages = 0;
  if (FILE* f = fopen("/proc/self/statm", "r")) {
    if (fscanf(f, "%ld", &pages) != 1) pages = 0;
    fclose(f);
  }
  const size_t room = static_cast<size_t>(args.num("room-mib", 48)) << 20;
  struct rlimit limit = {static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGESIZE)) + room,
                         RLIM_INFINITY};
  CHECK(cudaHostUnregister(p));
  free(p);
  if (setrlimit(RLIMIT_AS, &limit) != 0) Die("setrlimit");
  void* q = malloc(other);
  std::printf("room other=%s\n", q != nullptr ? "allocated" : "FAILED");
  if (q != nullptr) {
    Fill(q, other, 2);
    free(q);
  }
  limit.rlim_cur = RLIM_INFINITY;
  setrlimit(RLIMIT_AS, &limit);
  return 0;
}

// A cycle, then a pause longer than LAZYPIN_IDLE_MS, then the cycle again.
int ModeIdle(const tapp::Args& args) {
  const size_t n = 4 << 20;
  bool ok = Cycle(n, 1, Malloc) && Cycle(n, 2, Malloc);
  usleep(static_cast<useconds_t>(args.num("pause-ms", 600)) * 1000);
  ok = Cycle(n, 2, Malloc) && ok;
  std::printf("idle bytes=%s\n", ok ? "ok" : "WRONG");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  tapp::Args args(argc, argv, {"mode", "sizes", "iters", "threads", "pause-ms", "room-mib"}, {"fixed-threshold"},
                  "reuse --mode cycle|kept|calloc|align|usable|realloc|pageable|signal|threads|fork|idle|room|zeroed\n"
                  "      [--sizes 4K,1M,4M] [--iters N] [--threads N] [--pause-ms N] [--fixed-threshold]\n");
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));
  const std::string mode = args.str("mode", "cycle");
  int rc = 1;
  if (mode == "cycle") rc = ModeCycle(args);
  else if (mode == "kept") rc = ModeKept(args);
  else if (mode == "calloc") rc = ModeCalloc(args);
  else if (mode == "align") rc = ModeAlign(args);
  else if (mode == "usable") rc = ModeUsable(args);
  else if (mode == "realloc") rc = ModeRealloc(args);
  else if (mode == "pageable") rc = ModePageable(args);
  else if (mode == "signal") rc = ModeSignal(args);
  else if (mode == "threads") rc = ModeThreads(args);
  else if (mode == "fork") rc = ModeFork(args);
  else if (mode == "idle") rc = ModeIdle(args);
  else if (mode == "room") rc = ModeRoom(args);
  else if (mode == "zeroed") rc = ModeZeroed(args);
  else Die("unknown --mode " + mode);
  if (g_device != nullptr) CHECK(cudaFree(g_device));
  return rc;
}
