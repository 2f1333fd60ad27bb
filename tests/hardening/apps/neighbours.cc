// neighbours.cc: what a program sees of what a preloaded library keeps
// behind its back: descriptors it takes over, children it makes without
// fork(), address-space limits it sets, staged copies, blocks it gets back,
// signals and threads. Each case prints what it observed (codes, counts,
// never an address or a thread count), flushing every line, so that a test
// compares a run under lazypin with a bare run line by line and by exit status.
//
//   neighbours logfd        a pipe dup2'd onto every descriptor from 100 up,
//                           200 register/unregister cycles, the bytes read back
//   neighbours closeall HOW every descriptor from 3 up closed as a daemon
//                           does (HOW=close: one close() each, the successes
//                           counted; HOW=range: close_range; HOW=from:
//                           closefrom), then 100 cycles more
//   neighbours watchfd      a pipe's read end dup2'd onto every descriptor from
//                           100 up, deferred memory unmapped and mapped again,
//                           registered and copied, then the pipe's one byte
//   neighbours lowest       memory kept (cudaFreeHost, free of a registered
//                           block) while open() is checked to give the lowest
//                           free number, 20000 times over about a second
//   neighbours rawfork HOW  a deferred 1 MiB block; a child made by
//                           syscall(SYS_fork) (HOW=syscall) or clone(SIGCHLD)
//                           (HOW=clone) writes, registers, copies it there and
//                           back, unregisters and frees it: codes and bytes
//   neighbours rlimit WHAT  memory given back (a freed registered 64 MiB block,
//                           a 64 MiB cudaFreeHost), then RLIMIT_AS (WHAT=as) or
//                           RLIMIT_DATA (WHAT=data) set to what was mapped
//                           before plus 96 MiB: malloc, mmap, a thread with a
//                           80 MiB stack, cudaMallocHost, a register of 80 MiB
//   neighbours staged       a 3 MiB deferred source copied (async, busy stream)
//                           into a 2 MiB allocation: the code, and whether the
//                           device memory changed
//   neighbours stagedlate WHERE  a staged copy from a thread_local destructor,
//                           a pthread key destructor (WHERE=tls, key) or an
//                           atexit handler (WHERE=atexit), after mapping 1 MiB
//                           of its own: whether that mapping was left alone
//   neighbours served WHAT  blocks handed out again after a registered block
//                           was freed: memalign's usable size a fresh block's,
//                           valloc, pvalloc, realloc (WHAT=sizes); the tail of
//                           a cudaHostAlloc'd block's last page (WHAT=tail);
//                           mallinfo2 in use and malloc_info's mmapped
//                           blocks (WHAT=mallinfo); a read after
//                           cudaFreeHost (WHAT=readfreed: SIGSEGV); realloc of
//                           an interior pointer (WHAT=interior: glibc's abort)
//   neighbours signals      the dispositions of SIGINT and SIGTERM after CUDA
//                           use, and after the program's own handler
//   neighbours census       SIGUSR1 sent to every thread in /proc/self/task,
//                           each acknowledging from its handler
// Exit 0 ok, 1 setup, 2 data mismatch, 3 unexpected CUDA code (hcommon.h).
#include "hcommon.h"

#include <algorithm>
#include <cuda.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include <atomic>
#include <vector>

namespace {

constexpr size_t kMiB = size_t{1} << 20;

void say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void say(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stdout, fmt, ap);
  va_end(ap);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

// A malloc'd block, touched, registered and unregistered: deferred under lazypin.
unsigned char* Deferred(size_t bytes, int fill) {
  auto* p = static_cast<unsigned char*>(std::malloc(bytes));
  if (p == nullptr) std::exit(1);
  std::memset(p, fill, bytes);
  EXPECT(cudaHostRegister(p, bytes, cudaHostRegisterDefault), 0);
  EXPECT(cudaHostUnregister(p), 0);
  return p;
}

void Cycles(int n, size_t bytes) {
  unsigned char* p = static_cast<unsigned char*>(std::malloc(bytes));
  std::memset(p, 1, bytes);
  for (int i = 0; i < n; ++i) {
    EXPECT(cudaHostRegister(p, bytes, cudaHostRegisterDefault), 0);
    EXPECT(cudaHostUnregister(p), 0);
  }
  std::free(p);
}

int TopFd() {
  struct rlimit r;
  getrlimit(RLIMIT_NOFILE, &r);
  return r.rlim_cur == RLIM_INFINITY || r.rlim_cur > 1024 ? 1024 : static_cast<int>(r.rlim_cur);
}

void Sleep(int ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, nullptr);
}

// Keeps the stream busy for a while (the simulator: SIMCUDA_KERNEL_US per
// launch; the real driver: a large memset).
void Busy(cudaStream_t s, void* dev, size_t bytes) {
  void* args[1] = {nullptr};
  cuLaunchKernel(reinterpret_cast<CUfunction>(1), 1, 1, 1, 1, 1, 1, 0, s, args, nullptr);
  cudaGetLastError();
  for (int i = 0; i < 8; ++i) cudaMemsetAsync(dev, i, bytes, s);
}

int LogFd() {
  Cycles(4, 64 * 1024);
  int p[2];
  if (pipe(p) != 0) return 1;
  const int top = TopFd();
  for (int fd = 100; fd < top; ++fd) {
    if (fd != p[0] && fd != p[1]) dup2(p[1], fd);
  }
  char buf[1024];
  std::memset(buf, 'x', sizeof buf);
  if (write(100, buf, sizeof buf) != static_cast<ssize_t>(sizeof buf)) return 1;
  Cycles(200, 64 * 1024);
  Sleep(100);  // anything a writer thread has would be written by now
  for (int fd = 100; fd < top; ++fd) {
    if (fd != p[0]) close(fd);
  }
  close(p[1]);
  size_t total = 0;
  for (;;) {
    char in[4096];
    const ssize_t n = read(p[0], in, sizeof in);
    if (n <= 0) break;
    total += static_cast<size_t>(n);
  }
  say("wrote 1024, read back %zu", total);
  return 0;
}

int CloseAll(const char* how) {
  Cycles(4, 64 * 1024);
  int closed = 0;
  if (std::strcmp(how, "close") == 0) {
    for (int fd = 3; fd < TopFd(); ++fd) closed += close(fd) == 0;
    say("closed %d", closed);
  } else if (std::strcmp(how, "range") == 0) {
    say("close_range: %d", close_range(3, ~0u, 0));
  } else {
    closefrom(3);
    say("closefrom");
  }
  // Nothing the program opened is left: the next open gets 3.
  const int fd = open("/dev/null", O_RDONLY);
  say("next open: %d", fd);
  close(fd);
  Cycles(100, 64 * 1024);
  say("cycles after: ok");
  return 0;
}

int WatchFd() {
  Cycles(4, 64 * 1024);
  int p[2];
  if (pipe(p) != 0) return 1;
  const int top = TopFd();
  for (int fd = 100; fd < top; ++fd) {
    if (fd != p[0] && fd != p[1]) dup2(p[0], fd);
  }
  // Deferred memory unmapped, its address mapped again with new bytes,
  // registered and copied: the new bytes arrive.
  void* dev = nullptr;
  EXPECT(cudaMalloc(&dev, kMiB), 0);
  std::vector<unsigned char> check(kMiB);
  int stale = 0;
  for (int round = 0; round < 20; ++round) {
    void* m = mmap(nullptr, kMiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    auto* h = static_cast<unsigned char*>(m);
    std::memset(h, 1, kMiB);
    EXPECT(cudaHostRegister(h, kMiB, cudaHostRegisterDefault), 0);
    EXPECT(cudaHostUnregister(h), 0);
    syscall(SYS_munmap, h, kMiB);
    void* again = mmap(h, kMiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (again != m) return 1;
    std::memset(h, 2 + round, kMiB);
    EXPECT(cudaHostRegister(h, kMiB, cudaHostRegisterDefault), 0);
    EXPECT(cudaMemcpy(dev, h, kMiB, cudaMemcpyHostToDevice), 0);
    EXPECT(cudaMemcpy(check.data(), dev, kMiB, cudaMemcpyDeviceToHost), 0);
    if (check[0] != 2 + round || check[kMiB - 1] != 2 + round) ++stale;
    EXPECT(cudaHostUnregister(h), 0);
    munmap(h, kMiB);
  }
  say("stale copies: %d", stale);
  if (write(p[1], "!", 1) != 1) return 1;
  Sleep(100);
  fcntl(p[0], F_SETFL, O_NONBLOCK);
  char c = 0;
  const ssize_t n = read(p[0], &c, 1);
  say("the pipe's byte: %s", n == 1 && c == '!' ? "read" : "lost");
  return 0;
}

int Lowest() {
  // Memory kept: a pinned block freed, a registered block freed.
  void* h = nullptr;
  EXPECT(cudaMallocHost(&h, 4 * kMiB), 0);
  EXPECT(cudaFreeHost(h), 0);
  std::free(Deferred(4 * kMiB, 3));
  const int lowest = open("/dev/null", O_RDONLY);
  close(lowest);
  int higher = 0;
  for (int i = 0; i < 20000; ++i) {
    const int fd = open("/dev/null", O_RDONLY);
    if (fd != lowest) ++higher;
    close(fd);
    if (i % 400 == 0) Sleep(1);
  }
  say("open above the lowest free descriptor: %d of 20000", higher);
  return 0;
}

int RawForkChild(unsigned char* p) {
  std::memset(p, 0x5a, kMiB);
  const int reg = cudaHostRegister(p, kMiB, cudaHostRegisterDefault);
  void* dev = nullptr;
  const int alloc = cudaMalloc(&dev, kMiB);
  int match = -1;
  if (reg == 0 && alloc == 0) {
    std::vector<unsigned char> back(kMiB);
    cudaMemcpy(dev, p, kMiB, cudaMemcpyHostToDevice);
    cudaMemcpy(back.data(), dev, kMiB, cudaMemcpyDeviceToHost);
    match = back[0] == 0x5a && back[kMiB - 1] == 0x5a;
  }
  const int unreg = reg == 0 ? cudaHostUnregister(p) : -1;
  std::free(p);
  void* q = std::malloc(2 * kMiB);
  std::memset(q, 1, 2 * kMiB);
  std::free(q);
  say("child: register %d, copy %s, unregister %d", reg,
      match < 0 ? "not made" : match ? "fresh bytes" : "STALE bytes", unreg);
  return 0;
}

int CloneEntry(void* arg) { return RawForkChild(static_cast<unsigned char*>(arg)); }

int RawFork(const char* how) {
  unsigned char* p = Deferred(kMiB, 0x11);
  pid_t pid;
  std::vector<char> stack;
  if (std::strcmp(how, "syscall") == 0) {
    pid = static_cast<pid_t>(syscall(SYS_fork));
    if (pid == 0) _exit(RawForkChild(p));
  } else {
    stack.resize(1 << 20);
    pid = clone(CloneEntry, stack.data() + stack.size(), SIGCHLD, p);
  }
  if (pid < 0) return 1;
  int status = 0;
  // Bounded: a child stuck on a lock copied held is killed, not orphaned.
  pid_t done = 0;
  for (int i = 0; i < 2000 && done == 0; ++i) {
    done = waitpid(pid, &status, WNOHANG);
    if (done == 0) usleep(10000);
  }
  if (done == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    say("child hung (killed after 20 s)");
    return 1;
  }
  say("child exit: %d", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  EXPECT(cudaHostRegister(p, kMiB, cudaHostRegisterDefault), 0);
  EXPECT(cudaHostUnregister(p), 0);
  std::free(p);
  say("parent: registered again");
  return 0;
}

uint64_t MappedBytes(bool data) {
  // statm: size (pages) ... data (pages, data + stack).
  FILE* f = std::fopen("/proc/self/statm", "r");
  unsigned long size = 0, res = 0, shared = 0, text = 0, lib = 0, dat = 0;
  if (f != nullptr) {
    if (std::fscanf(f, "%lu %lu %lu %lu %lu %lu", &size, &res, &shared, &text, &lib, &dat) != 6) size = 0;
    std::fclose(f);
  }
  return static_cast<uint64_t>(data ? dat : size) * 4096;
}

void* Idle(void*) { return nullptr; }

// NEIGHBOURS_MAPS=1: the mappings of 1 MiB or more on stderr, with the
// total, under a label (for finding what takes the address space).
void DumpMaps(const char* label) {
  if (std::getenv("NEIGHBOURS_MAPS") == nullptr) return;
  FILE* f = std::fopen("/proc/self/maps", "r");
  if (f == nullptr) return;
  char line[512];
  unsigned long total = 0;
  std::fprintf(stderr, "maps %s:\n", label);
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line, "%lx-%lx", &lo, &hi) != 2) continue;
    total += hi - lo;
    if (hi - lo >= kMiB) std::fprintf(stderr, "  %7lu KiB %s", (hi - lo) >> 10, line);
  }
  std::fclose(f);
  std::fprintf(stderr, "maps %s: total %lu KiB\n", label, total >> 10);
}

int Rlimit(const char* what) {
  const bool data = std::strcmp(what, "data") == 0;
  void* warm = nullptr;
  EXPECT(cudaMalloc(&warm, kMiB), 0);
  std::free(Deferred(kMiB, 7));  // a first cycle of each: set-up's own mappings made
  void* h = nullptr;
  EXPECT(cudaMallocHost(&h, kMiB), 0);
  EXPECT(cudaFreeHost(h), 0);
  // What the program has mapped while it holds nothing: the limit is that
  // plus 96 MiB, set after cycles that give 128 MiB back. Measured once
  // lazypin's threads have handled those calls: a thread's first allocation
  // gives it a glibc arena, 64 MiB of address space (the README's "What
  // lazypin holds"), which is not memory kept.
  Sleep(300);
  const uint64_t base = MappedBytes(data);
  DumpMaps("base");
  std::free(Deferred(64 * kMiB, 7));
  EXPECT(cudaMallocHost(&h, 64 * kMiB), 0);
  EXPECT(cudaFreeHost(h), 0);
  struct rlimit lim;
  lim.rlim_cur = lim.rlim_max = base + 96 * kMiB;
  DumpMaps("before the limit");
  if (setrlimit(data ? RLIMIT_DATA : RLIMIT_AS, &lim) != 0) return 1;
  DumpMaps("under the limit");
  const size_t big = 80 * kMiB;
  void* m = std::malloc(big);
  say("malloc 80 MiB: %s", m != nullptr ? "ok" : "NULL");
  std::free(m);
  void* mm = mmap(nullptr, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  say("mmap 80 MiB: %s", mm != MAP_FAILED ? "ok" : strerrorname_np(errno));
  if (mm != MAP_FAILED) munmap(mm, big);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, big);
  pthread_t t;
  const int made = pthread_create(&t, &attr, Idle, nullptr);
  say("thread with an 80 MiB stack: %s", made == 0 ? "ok" : strerrorname_np(made));
  if (made == 0) pthread_join(t, nullptr);
  void* ph = nullptr;
  const int host = cudaMallocHost(&ph, big);
  say("cudaMallocHost 80 MiB: %d", host);
  if (host == 0) cudaFreeHost(ph);
  void* r = mmap(nullptr, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (r != MAP_FAILED) {
    say("register 80 MiB: %d", cudaHostRegister(r, big, cudaHostRegisterDefault));
    cudaHostUnregister(r);
    munmap(r, big);
  } else {
    say("register 80 MiB: no mapping (%s)", strerrorname_np(errno));
  }
  return 0;
}

int Staged() {
  cudaStream_t s;
  EXPECT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), 0);
  CUdeviceptr dst = 0;
  EXPECT(cuMemAlloc(&dst, 2 * kMiB), 0);
  EXPECT(cuMemsetD8(dst, 0x33, 2 * kMiB), 0);
  void* busy = nullptr;
  EXPECT(cudaMalloc(&busy, 64 * kMiB), 0);
  unsigned char* src = Deferred(3 * kMiB, 0x77);
  Busy(s, busy, 64 * kMiB);
  const int rc = cuMemcpyHtoDAsync(dst, src, 3 * kMiB, s);
  const int sync = cudaStreamSynchronize(s);
  std::vector<unsigned char> back(2 * kMiB);
  EXPECT(cuMemcpyDtoH(back.data(), dst, 2 * kMiB), 0);
  size_t changed = 0;
  for (unsigned char c : back) changed += c != 0x33;
  say("3 MiB into 2 MiB: %d, synchronize %d, device bytes changed: %zu", rc, sync, changed);
  // The same copy where it fits: done, and the bytes arrive.
  Busy(s, busy, 64 * kMiB);
  EXPECT(cuMemcpyHtoDAsync(dst, src, 2 * kMiB, s), 0);
  EXPECT(cudaStreamSynchronize(s), 0);
  EXPECT(cuMemcpyDtoH(back.data(), dst, 2 * kMiB), 0);
  say("2 MiB into 2 MiB: %s", back[0] == 0x77 && back[2 * kMiB - 1] == 0x77 ? "arrived" : "MISSING");
  std::free(src);
  return 0;
}

struct Late {
  cudaStream_t s = nullptr;
  void* busy = nullptr;
  CUdeviceptr dst = 0;
  unsigned char* src = nullptr;
};
Late g_late;

// Maps 1 MiB (where a just-unmapped scratch would be), makes a staged copy,
// and says whether the mapping kept its bytes.
void LateCopy(const char* where) {
  auto* mine = static_cast<unsigned char*>(
      mmap(nullptr, kMiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  std::memset(mine, 'A', kMiB);
  Busy(g_late.s, g_late.busy, 64 * kMiB);
  const int rc = cuMemcpyHtoDAsync(g_late.dst, g_late.src, kMiB, g_late.s);
  cudaStreamSynchronize(g_late.s);
  size_t changed = 0;
  for (size_t i = 0; i < kMiB; ++i) changed += mine[i] != 'A';
  say("%s: copy %d, own mapping bytes changed: %zu", where, rc, changed);
  munmap(mine, kMiB);
}

struct TlsCopier {
  ~TlsCopier() { LateCopy("thread_local destructor"); }
};
pthread_key_t g_key;

void* LateThread(void* arg) {
  const bool tls = std::strcmp(static_cast<const char*>(arg), "tls") == 0;
  if (tls) {
    static thread_local TlsCopier copier;  // constructed before the scratch: destroyed after it
    (void)&copier;
  } else {
    pthread_setspecific(g_key, &g_key);
  }
  // A staged copy on this thread: the scratch is made now.
  Busy(g_late.s, g_late.busy, 64 * kMiB);
  EXPECT(cuMemcpyHtoDAsync(g_late.dst, g_late.src, kMiB, g_late.s), 0);
  EXPECT(cudaStreamSynchronize(g_late.s), 0);
  return nullptr;
}

int StagedLate(const char* where) {
  EXPECT(cudaStreamCreateWithFlags(&g_late.s, cudaStreamNonBlocking), 0);
  EXPECT(cuMemAlloc(&g_late.dst, kMiB), 0);
  EXPECT(cudaMalloc(&g_late.busy, 64 * kMiB), 0);
  g_late.src = Deferred(kMiB, 0x42);
  if (std::strcmp(where, "atexit") == 0) {
    std::atexit([] { LateCopy("atexit handler"); });
    Busy(g_late.s, g_late.busy, 64 * kMiB);
    EXPECT(cuMemcpyHtoDAsync(g_late.dst, g_late.src, kMiB, g_late.s), 0);
    EXPECT(cudaStreamSynchronize(g_late.s), 0);
    return 0;
  }
  pthread_key_create(&g_key, [](void*) { LateCopy("pthread key destructor"); });
  pthread_t t;
  pthread_create(&t, nullptr, LateThread, const_cast<char*>(where));
  pthread_join(t, nullptr);
  return 0;
}

// Whether `p`'s usable size is one glibc gives a fresh block of `bytes` at
// `align`. Whether glibc carves a large block from the heap or maps it
// depends on the heap's layout (its top's slack, run to run, bare too), so
// either shape counts. Carved: the request rounded up to a chunk (a
// remainder under glibc's 32-byte minimum stays on). Mapped: up to the
// mapping's end, a page boundary, less than an alignment and a page over.
bool FreshUsable(void* p, size_t bytes, size_t align) {
  const size_t usable = malloc_usable_size(p);
  const size_t chunk = std::max<size_t>(32, (bytes + 8 + 15) & ~size_t{15});
  const bool carved = usable >= chunk - 8 && usable < chunk + 24;
  const bool mapped = (reinterpret_cast<uintptr_t>(p) + usable) % 4096 == 0 && usable >= bytes &&
                      usable < bytes + align + 4096 + 64;
  return carved || mapped;
}

int Served(const char* what) {
  // Blocks of several kinds freed registered: what lazypin may keep and serve.
  for (size_t bytes : {64 * 1024ul, 200 * 1024ul, kMiB, 2 * kMiB, 3 * kMiB}) std::free(Deferred(bytes, 9));
  if (std::strcmp(what, "sizes") == 0) {
    for (size_t align : {4096ul, 65536ul, 2 * kMiB}) {
      for (size_t bytes : {64 * 1024ul, kMiB, 3 * kMiB}) {
        void* p = memalign(align, bytes);
        say("memalign(%zu, %zu): a fresh block's usable size %d, aligned %d", align, bytes,
            FreshUsable(p, bytes, align), reinterpret_cast<uintptr_t>(p) % align == 0);
        std::free(Deferred(bytes, 1));
        std::free(p);
      }
    }
    for (size_t bytes : {100000ul, kMiB, 3 * kMiB}) {
      void* v = valloc(bytes);
      say("valloc(%zu): a fresh block's usable size %d", bytes, FreshUsable(v, bytes, 4096));
      std::free(v);
      void* pv = pvalloc(bytes);
      say("pvalloc(%zu): a fresh block's usable size %d", bytes,
          FreshUsable(pv, (bytes + 4095) & ~size_t{4095}, 4096));
      std::free(pv);
      std::free(Deferred(bytes, 2));
      void* r = std::malloc(bytes);
      void* r2 = std::realloc(r, bytes + 5000);
      say("realloc(%zu -> +5000): a fresh block's usable size %d", bytes, FreshUsable(r2, bytes + 5000, 16));
      void* r3 = std::realloc(r2, bytes / 2);
      say("realloc(-> %zu): a fresh block's usable size %d", bytes / 2, FreshUsable(r3, bytes / 2, 16));
      std::free(r3);
    }
    return 0;
  }
  if (std::strcmp(what, "tail") == 0) {
    const size_t bytes = kMiB + 100;
    for (int round = 0; round < 3; ++round) {
      unsigned char* h = nullptr;
      EXPECT(cudaHostAlloc(reinterpret_cast<void**>(&h), bytes, cudaHostAllocDefault), 0);
      size_t nonzero = 0;
      const size_t page_end = (bytes + 4095) & ~size_t{4095};
      for (size_t i = 0; i < page_end; ++i) nonzero += h[i] != 0;
      say("cudaHostAlloc(%zu) round %d: nonzero bytes to the page's end: %zu", bytes, round, nonzero);
      std::memset(h, 0xee, page_end);
      EXPECT(cudaFreeHost(h), 0);
    }
    return 0;
  }
  if (std::strcmp(what, "mallinfo") == 0) {
    const size_t before = mallinfo2().uordblks + mallinfo2().hblkhd;
    for (int i = 0; i < 4; ++i) std::free(Deferred(2 * kMiB, i));
    const size_t after = mallinfo2().uordblks + mallinfo2().hblkhd;
    say("mallinfo2 in use grew by at least 1 MiB: %s", after >= before + kMiB ? "yes" : "no");
    // glibc's own report: the mmapped blocks it counts, before the frees and after.
    auto mmapped = [] {
      char* text = nullptr;
      size_t length = 0;
      FILE* f = open_memstream(&text, &length);
      if (f == nullptr || malloc_info(0, f) != 0) return -1L;
      std::fclose(f);
      long count = -1;
      if (const char* at = std::strstr(text, "<total type=\"mmap\" count=\"")) {
        count = std::strtol(at + std::strlen("<total type=\"mmap\" count=\""), nullptr, 10);
      }
      std::free(text);
      return count;
    };
    const long blocks_before = mmapped();
    void* held[4];
    for (int i = 0; i < 4; ++i) held[i] = std::malloc(8 * kMiB);
    const long blocks_held = mmapped();
    for (int i = 0; i < 4; ++i) {
      EXPECT(cudaHostRegister(held[i], 8 * kMiB, cudaHostRegisterDefault), 0);
      EXPECT(cudaHostUnregister(held[i]), 0);
      std::free(held[i]);
    }
    say("malloc_info mmapped blocks: %ld more while held, %ld more after the frees",
        blocks_held - blocks_before, mmapped() - blocks_before);
    return 0;
  }
  if (std::strcmp(what, "readfreed") == 0) {
    unsigned char* h = nullptr;
    EXPECT(cudaMallocHost(reinterpret_cast<void**>(&h), 4 * kMiB), 0);
    h[0] = 1;
    EXPECT(cudaFreeHost(h), 0);
    say("reading freed pinned memory");
    volatile unsigned char c = h[0];
    say("read %d", c);
    return 0;
  }
  if (std::strcmp(what, "interior") == 0) {
    auto* p = static_cast<unsigned char*>(std::malloc(4 * kMiB));
    std::memset(p, 1, 4 * kMiB);
    EXPECT(cudaHostRegister(p, 4 * kMiB, cudaHostRegisterDefault), 0);
    EXPECT(cudaHostUnregister(p), 0);
    say("realloc of an interior pointer");
    void* volatile interior = p + 8192;
    void* q = std::realloc(interior, 8 * kMiB);
    say("realloc returned %s", q != nullptr ? "a block" : "NULL");
    return 0;
  }
  return 1;
}

volatile sig_atomic_t g_got = 0;
std::atomic<int> g_acks{0};

const char* Disposition(int sig) {
  struct sigaction old;
  sigaction(sig, nullptr, &old);
  if (old.sa_flags & SA_SIGINFO) return "a handler (siginfo)";
  if (old.sa_handler == SIG_DFL) return "default";
  if (old.sa_handler == SIG_IGN) return "ignored";
  return "a handler";
}

int Signals() {
  say("before CUDA: SIGINT %s, SIGTERM %s", Disposition(SIGINT), Disposition(SIGTERM));
  Cycles(4, 64 * 1024);
  say("after CUDA: SIGINT %s, SIGTERM %s", Disposition(SIGINT), Disposition(SIGTERM));
  struct sigaction mine = {};
  mine.sa_handler = [](int) { g_got = g_got + 1; };
  sigemptyset(&mine.sa_mask);
  struct sigaction old = {};
  sigaction(SIGTERM, &mine, &old);
  say("replaced SIGTERM's %s", old.sa_handler == SIG_DFL ? "default" : "handler");
  raise(SIGTERM);
  say("own SIGTERM handler ran %d times", static_cast<int>(g_got));
  signal(SIGINT, SIG_IGN);
  say("SIGINT %s after signal(SIG_IGN)", Disposition(SIGINT));
  raise(SIGINT);
  struct sigaction back = {};
  back.sa_handler = SIG_DFL;
  sigaction(SIGTERM, &back, &old);
  say("SIGTERM's handler was %s", old.sa_handler == SIG_DFL ? "default" : "the program's");
  say("SIGTERM %s, SIGINT %s", Disposition(SIGTERM), Disposition(SIGINT));
  Cycles(4, 64 * 1024);
  say("SIGTERM %s after more CUDA", Disposition(SIGTERM));
  return 0;
}

int Census() {
  Cycles(4, 64 * 1024);
  std::free(Deferred(kMiB, 4));
  struct sigaction ack = {};
  ack.sa_handler = [](int) { g_acks.fetch_add(1); };
  sigemptyset(&ack.sa_mask);
  sigaction(SIGUSR1, &ack, nullptr);
  int sent = 0;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return 1;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    if (syscall(SYS_tgkill, getpid(), atoi(e->d_name), SIGUSR1) == 0) ++sent;
  }
  closedir(d);
  for (int i = 0; i < 2000 && g_acks.load() < sent; ++i) Sleep(1);
  say("every thread acknowledged: %s", g_acks.load() >= sent ? "yes" : "no");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 1;
  const char* mode = argv[1];
  const char* arg = argc > 2 ? argv[2] : "";
  if (std::strcmp(mode, "logfd") == 0) return LogFd();
  if (std::strcmp(mode, "watchfd") == 0) return WatchFd();
  if (std::strcmp(mode, "closeall") == 0) return CloseAll(arg);
  if (std::strcmp(mode, "lowest") == 0) return Lowest();
  if (std::strcmp(mode, "rawfork") == 0) return RawFork(arg);
  if (std::strcmp(mode, "rlimit") == 0) return Rlimit(arg);
  if (std::strcmp(mode, "staged") == 0) return Staged();
  if (std::strcmp(mode, "stagedlate") == 0) return StagedLate(arg);
  if (std::strcmp(mode, "served") == 0) return Served(arg);
  if (std::strcmp(mode, "signals") == 0) return Signals();
  if (std::strcmp(mode, "census") == 0) return Census();
  return 1;
}
