// unseen.cc: pages that change under a registration through paths no PLT hook
// sees (issue 13). For each path: register a buffer, fill it, copy it to the
// device, unregister; change its pages by that path; map new memory at the
// same address with different bytes; then (--then):
//   register  register it again, copy it to the device and back, and compare;
//   copy      copy it as pageable memory, with no call in between that
//             registers anything: cudaMemcpy to the device and back (--dir
//             htod), or from the device into it (--dir dtoh), and compare;
//   async     the same with cudaMemcpyAsync on a stream, then synchronize.
// --thread other makes those copies on a second thread (handed over after the
// change), --thread same on the thread that changed the pages.
// One line per case:
//   unseen <case> OK      the bytes round-tripped
//   unseen <case> STALE   the device got other bytes (DMA from the old pages)
//   unseen <case> SKIP    this kernel or system lacks the path
// The output is the same bare, in log mode and in defer mode on a correct
// shim. On the simulated stack the copies move bytes by virtual address, so
// its stale-frame detector (SIMCUDA_STALE) is what catches an old frame.
//
// --stress N: instead of the cases, one thread registers, copies and
// unregisters buffers and then replaces their pages by raw system calls
// (munmap + mmap, MAP_FIXED mmap, madvise) and writes new bytes, N times,
// while a second thread copies each changed buffer to the device and back as
// soon as it is handed over (the changes of the next buffers run meanwhile).
// Prints "stress <N> copies, <M> STALE".
//
// CLI: unseen [--size 64K] [--only <case>] [--then register|copy|async]
//             [--dir htod|dtoh] [--thread same|other] [--stress N]
// Exit: 0 (whatever the cases printed); 1 on a setup failure.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "common.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <malloc.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

namespace {

const char* kUsage =
    "usage: unseen [--size 64K] [--only <case>] [--then register|copy|async] [--dir htod|dtoh]\n"
    "              [--thread same|other] [--stress N]\n";
const size_t P = tapp::kPage;

size_t g_size = 64 << 10;
void* g_dev = nullptr;
unsigned char* g_check = nullptr;

// Registers, fills with `seed`'s bytes, copies to the device, unregisters.
void First(void* buf, size_t n, uint64_t seed) {
  tapp::fill_full(buf, n, seed);
  CHECK(cudaHostRegister(buf, n, cudaHostRegisterDefault));
  CHECK(cudaMemcpy(g_dev, buf, n, cudaMemcpyHostToDevice));
  CHECK(cudaHostUnregister(buf));
}

enum class Then { kRegister, kCopy, kAsync };
Then g_then = Then::kRegister;
bool g_dtoh = false;
cudaStream_t g_stream = nullptr;

// The second thread of --thread other: runs each job handed to it, in order.
class Copier {
 public:
  Copier() : thread_([this] { Loop(); }) {}
  ~Copier() {
    Post(nullptr);
    thread_.join();
  }
  // Hands `job` over and returns at once (null: stop).
  void Post(std::function<void()> job) {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
    cv_.notify_all();
  }
  // Runs `job` there and waits for it.
  void Run(std::function<void()> job) {
    bool done = false;
    Post([&] {
      job();
      std::lock_guard<std::mutex> lock(mu_);
      done = true;
      cv_.notify_all();
    });
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done; });
  }

 private:
  void Loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !jobs_.empty(); });
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      if (!job) return;
      job();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::thread thread_;
};
Copier* g_copier = nullptr;

void Copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  if (g_then == Then::kAsync) {
    CHECK(cudaMemcpyAsync(dst, src, n, kind, g_stream));
    CHECK(cudaStreamSynchronize(g_stream));
  } else {
    CHECK(cudaMemcpy(dst, src, n, kind));
  }
}

// The copies of a changed buffer, with nothing registered in between:
// host to device and back into g_check, or device to host into it.
const char* CopyChanged(void* buf, size_t n, uint64_t seed) {
  if (g_dtoh) {
    tapp::fill_full(g_check, n, seed + 1000);
    CHECK(cudaMemcpy(g_dev, g_check, n, cudaMemcpyHostToDevice));
    // A copy from pageable memory may return before its DMA ends, and an
    // async copy on another stream is not ordered after it: wait for it.
    CHECK(cudaDeviceSynchronize());
    Copy(buf, g_dev, n, cudaMemcpyDeviceToHost);
  } else {
    Copy(g_dev, buf, n, cudaMemcpyHostToDevice);
    std::memset(g_check, 0, n);
    CHECK(cudaMemcpy(g_check, g_dev, n, cudaMemcpyDeviceToHost));
  }
  return tapp::first_diff(g_check, buf, n) < 0 ? "OK" : "STALE";
}

// Fills with `seed`'s bytes, then (--then) registers, copies to the device
// and back, or copies it as pageable memory.
const char* Second(void* buf, size_t n, uint64_t seed) {
  tapp::fill_full(buf, n, seed);
  if (g_then != Then::kRegister) {
    if (g_copier == nullptr) return CopyChanged(buf, n, seed);
    const char* r = nullptr;
    g_copier->Run([&] { r = CopyChanged(buf, n, seed); });
    return r;
  }
  CHECK(cudaHostRegister(buf, n, cudaHostRegisterDefault));
  CHECK(cudaMemcpy(g_dev, buf, n, cudaMemcpyHostToDevice));
  std::memset(g_check, 0, n);
  CHECK(cudaMemcpy(g_check, g_dev, n, cudaMemcpyDeviceToHost));
  CHECK(cudaHostUnregister(buf));
  return tapp::first_diff(g_check, buf, n) < 0 ? "OK" : "STALE";
}

char* MapAnon(size_t n, void* at = nullptr) {
  void* p = mmap(at, n, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | (at ? MAP_FIXED_NOREPLACE : 0), -1, 0);
  if (p == MAP_FAILED) {
    std::fprintf(stderr, "mmap failed\n");
    std::exit(1);
  }
  return static_cast<char*>(p);
}

// The new memory at the same address: a MAP_FIXED_NOREPLACE mmap, which
// no hook treats as replacing anything.
char* MapAgain(char* at, size_t n) { return MapAnon(n, at); }

const char* RawMunmap() {
  char* p = MapAnon(g_size);
  First(p, g_size, 1);
  syscall(SYS_munmap, p, g_size);
  p = MapAgain(p, g_size);
  const char* r = Second(p, g_size, 2);
  munmap(p, g_size);
  return r;
}

const char* RawMmapFixed() {
  char* p = MapAnon(g_size);
  First(p, g_size, 3);
  syscall(SYS_mmap, p, g_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  const char* r = Second(p, g_size, 4);
  munmap(p, g_size);
  return r;
}

const char* RawMadvise() {
  char* p = MapAnon(g_size);
  First(p, g_size, 5);
  syscall(SYS_madvise, p, g_size, MADV_DONTNEED);
  const char* r = Second(p, g_size, 6);
  munmap(p, g_size);
  return r;
}

const char* RawMremap() {
  char* p = MapAnon(g_size);
  char* elsewhere = MapAnon(g_size);
  First(p, g_size, 7);
  syscall(SYS_mremap, p, g_size, g_size, MREMAP_MAYMOVE | MREMAP_FIXED, elsewhere);
  p = MapAgain(p, g_size);
  const char* r = Second(p, g_size, 8);
  munmap(p, g_size);
  munmap(elsewhere, g_size);
  return r;
}

const char* RawBrk() {
  // Room at the heap's top first, so that malloc needs no sbrk meanwhile
  // (glibc's idea of the break stays right).
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  free(malloc(16 << 20));
  const uintptr_t start = static_cast<uintptr_t>(syscall(SYS_brk, 0));
  const uintptr_t lo = (start + P - 1) & ~(P - 1);
  const uintptr_t top = lo + g_size;
  if (static_cast<uintptr_t>(syscall(SYS_brk, top)) != top) return "SKIP";
  char* p = reinterpret_cast<char*>(lo);
  First(p, g_size, 9);
  const bool ours = static_cast<uintptr_t>(syscall(SYS_brk, 0)) == top;
  syscall(SYS_brk, start);  // shrink: the pages leave
  if (!ours || static_cast<uintptr_t>(syscall(SYS_brk, top)) != top) {
    syscall(SYS_brk, start);
    return "SKIP";
  }
  const char* r = Second(p, g_size, 10);
  syscall(SYS_brk, start);
  return r;
}

const char* ProcessMadvise() {
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, getpid(), 0));
  if (pidfd < 0) return "SKIP";
  char* p = MapAnon(g_size);
  First(p, g_size, 11);
  struct iovec iov = {p, g_size};
  const long done = syscall(SYS_process_madvise, pidfd, &iov, 1, MADV_DONTNEED, 0);
  close(pidfd);
  const char* r = done == static_cast<long>(g_size) ? Second(p, g_size, 12) : "SKIP";
  munmap(p, g_size);
  return r;
}

const char* GuardInstall() {
  constexpr int kGuardInstall = 102, kGuardRemove = 103;
  char* p = MapAnon(g_size);
  First(p, g_size, 13);
  if (madvise(p, g_size, kGuardInstall) != 0) {
    munmap(p, g_size);
    return "SKIP";
  }
  madvise(p, g_size, kGuardRemove);
  const char* r = Second(p, g_size, 14);
  munmap(p, g_size);
  return r;
}

// A buffer on a thread's stack; the thread ends (glibc discards its stack
// from inside libc) and a new thread gets the cached stack at the same address.
struct StackCase {
  uint64_t seed;
  bool second;
  const char* result;
};

void* StackBody(void* arg) {
  auto* c = static_cast<StackCase*>(arg);
  alignas(4096) unsigned char buf[64 << 10];
  if (c->second) {
    c->result = Second(buf, sizeof buf, c->seed);
  } else {
    First(buf, sizeof buf, c->seed);
  }
  return nullptr;
}

const char* ThreadStack() {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 1 << 20);
  StackCase first = {15, false, nullptr}, second = {16, true, nullptr};
  pthread_t t;
  if (pthread_create(&t, &attr, StackBody, &first) != 0) return "SKIP";
  pthread_join(t, nullptr);
  if (pthread_create(&t, &attr, StackBody, &second) != 0) return "SKIP";
  pthread_join(t, nullptr);
  pthread_attr_destroy(&attr);
  return second.result;
}

std::string LibraryBesideExe(const char* name) {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return name;
  exe[n] = '\0';
  std::string dir(exe);
  return dir.substr(0, dir.rfind('/') + 1) + name;
}

const char* Dlclose() {
  const std::string path = LibraryBesideExe("libunseen_bss.so");
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::fprintf(stderr, "dlopen %s: %s\n", path.c_str(), dlerror());
    std::exit(1);
  }
  char* bss = static_cast<char*>(dlsym(lib, "unseen_bss"));
  char* p = bss + 4 * P;  // whole pages of the anonymous part of .bss
  const size_t n = std::min<size_t>(g_size, (1 << 20) - 8 * P);
  First(p, n, 17);
  dlclose(lib);  // ld.so unmaps it, from inside the loader
  lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  char* again = static_cast<char*>(dlsym(lib, "unseen_bss")) + 4 * P;
  const char* r = Second(again, n, 18);
  dlclose(lib);
  return r;
}

// A MAP_SHARED memfd whose pages `change` replaces without any munmap.
template <typename Change>
const char* SharedMemfd(uint64_t seed, Change change) {
  const int fd = memfd_create("unseen", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(g_size)) != 0) return "SKIP";
  char* p = static_cast<char*>(mmap(nullptr, g_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  if (p == MAP_FAILED) return "SKIP";
  First(p, g_size, seed);
  const char* r = change(fd, p) ? Second(p, g_size, seed + 1) : "SKIP";
  munmap(p, g_size);
  close(fd);
  return r;
}

const char* MemfdPunchHole() {
  return SharedMemfd(19, [](int fd, char*) {
    return fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                     static_cast<off_t>(g_size)) == 0;
  });
}

const char* MemfdTruncate() {
  return SharedMemfd(21, [](int fd, char*) {
    return ftruncate(fd, 0) == 0 && ftruncate(fd, static_cast<off_t>(g_size)) == 0;
  });
}

const char* RemapFilePages() {
  return SharedMemfd(23, [](int, char* p) {
    // The first page now shows the file's second page.
    return syscall(SYS_remap_file_pages, p, P, 0, 1, 0) == 0;
  });
}

// shmdt of a segment that mprotect split: the buffer lies past the split.
const char* ShmdtSplit() {
  const size_t seg = g_size + 8 * P;
  const int id = shmget(IPC_PRIVATE, seg, IPC_CREAT | 0600);
  if (id < 0) return "SKIP";
  char* p = static_cast<char*>(shmat(id, nullptr, 0));
  shmctl(id, IPC_RMID, nullptr);
  if (p == reinterpret_cast<char*>(-1)) return "SKIP";
  mprotect(p + P, P, PROT_READ);
  First(p + 4 * P, g_size, 25);
  shmdt(p);
  const int id2 = shmget(IPC_PRIVATE, seg, IPC_CREAT | 0600);
  char* q = id2 < 0 ? reinterpret_cast<char*>(-1) : static_cast<char*>(shmat(id2, p, 0));
  if (id2 >= 0) shmctl(id2, IPC_RMID, nullptr);
  if (q == reinterpret_cast<char*>(-1)) return "SKIP";
  const char* r = Second(q + 4 * P, g_size, 26);
  shmdt(q);
  return r;
}

struct Case {
  const char* name;
  const char* (*run)();
};
const Case kCases[] = {
    {"raw_munmap", RawMunmap},         {"raw_mmap_fixed", RawMmapFixed},
    {"raw_madvise", RawMadvise},       {"raw_mremap", RawMremap},
    {"raw_brk", RawBrk},               {"process_madvise", ProcessMadvise},
    {"guard_install", GuardInstall},   {"thread_stack", ThreadStack},
    {"dlclose", Dlclose},              {"memfd_punch_hole", MemfdPunchHole},
    {"memfd_truncate", MemfdTruncate}, {"remap_file_pages", RemapFilePages},
    {"shmdt_split", ShmdtSplit},
};

// --stress: this thread changes pages by raw system calls while the copier
// copies the buffers changed before.
void Stress(int rounds) {
  constexpr int kSlots = 8;
  const size_t n = g_size;
  char* slot[kSlots];
  for (char*& p : slot) p = MapAnon(n);
  void* dev[kSlots];
  unsigned char* check[kSlots];
  for (int i = 0; i < kSlots; ++i) {
    CHECK(cudaMalloc(&dev[i], n));
    check[i] = static_cast<unsigned char*>(tapp::alloc_aligned(n));
  }
  std::mutex mu;
  std::condition_variable cv;
  int busy[kSlots] = {};  // handed over and not yet copied
  int stale = 0;
  Copier copier;
  for (int r = 0; r < rounds; ++r) {
    const int i = r % kSlots;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return busy[i] == 0; });
    }
    char* p = slot[i];
    tapp::fill_full(p, n, 100 + r);
    CHECK(cudaHostRegister(p, n, cudaHostRegisterDefault));
    CHECK(cudaMemcpy(dev[i], p, n, cudaMemcpyHostToDevice));
    CHECK(cudaHostUnregister(p));
    switch (r % 3) {
      case 0:
        syscall(SYS_munmap, p, n);
        MapAgain(p, n);
        break;
      case 1:
        syscall(SYS_mmap, p, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        break;
      default:
        syscall(SYS_madvise, p, n, MADV_DONTNEED);
        break;
    }
    tapp::fill_full(p, n, 200 + r);
    {
      std::lock_guard<std::mutex> lock(mu);
      busy[i] = 1;
    }
    copier.Post([&, i, p] {
      CHECK(cudaMemcpy(dev[i], p, n, cudaMemcpyHostToDevice));
      std::memset(check[i], 0, n);
      CHECK(cudaMemcpy(check[i], dev[i], n, cudaMemcpyDeviceToHost));
      std::lock_guard<std::mutex> lock(mu);
      if (tapp::first_diff(check[i], p, n) >= 0) ++stale;
      busy[i] = 0;
      cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] {
      for (int b : busy) {
        if (b != 0) return false;
      }
      return true;
    });
  }
  std::printf("stress %d copies, %d STALE\n", rounds, stale);
  for (int i = 0; i < kSlots; ++i) {
    CHECK(cudaFree(dev[i]));
    munmap(slot[i], n);
  }
}

}  // namespace

int main(int argc, char** argv) {
  tapp::Args args(argc, argv, {"size", "only", "then", "dir", "thread", "stress"}, {}, kUsage);
  g_size = (args.size("size", 64 << 10) + P - 1) & ~(P - 1);
  const std::string only = args.str("only", "");
  const std::string then = args.str("then", "register");
  const std::string dir = args.str("dir", "htod");
  const std::string thread = args.str("thread", "same");
  if ((then != "register" && then != "copy" && then != "async") || (dir != "htod" && dir != "dtoh") ||
      (thread != "same" && thread != "other")) {
    std::fputs(kUsage, stderr);
    return 1;
  }
  g_then = then == "copy" ? Then::kCopy : then == "async" ? Then::kAsync : Then::kRegister;
  g_dtoh = dir == "dtoh";
  CHECK(cudaMalloc(&g_dev, g_size));
  CHECK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  g_check = static_cast<unsigned char*>(tapp::alloc_aligned(g_size));
  const int stress = static_cast<int>(args.size("stress", 0));
  if (stress > 0) {
    Stress(stress);
    CHECK(cudaFree(g_dev));
    std::printf("UNSEEN done\n");
    return 0;
  }
  Copier* copier = thread == "other" ? new Copier : nullptr;
  g_copier = copier;
  for (const Case& c : kCases) {
    if (!only.empty() && only != c.name) continue;
    const char* r = c.run();
    std::printf("unseen %s %s\n", c.name, r);
    std::fflush(stdout);
  }
  g_copier = nullptr;
  delete copier;
  CHECK(cudaStreamDestroy(g_stream));
  CHECK(cudaFree(g_dev));
  std::printf("UNSEEN done\n");
  return 0;
}
