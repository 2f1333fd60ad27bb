// unseen.cc: pages that change under a registration through paths no PLT hook
// sees (issue 13). For each path: register a buffer, fill it, copy it to the
// device, unregister; change its pages by that path; map new memory at the
// same address with different bytes; register again, copy it to the device
// and back, and compare. One line per case:
//   unseen <case> OK      the bytes round-tripped
//   unseen <case> STALE   the device got other bytes (DMA from the old pages)
//   unseen <case> SKIP    this kernel or system lacks the path
// The output is the same bare, in log mode and in defer mode on a correct
// shim. On the simulated stack the copies move bytes by virtual address, so
// its stale-frame detector (SIMCUDA_STALE) is what catches an old frame.
//
// CLI: unseen [--size 64K] [--only <case>]
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

#include <string>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

namespace {

const char* kUsage = "usage: unseen [--size 64K] [--only <case>]\n";
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

// Fills with `seed`'s bytes, registers, copies to the device and back.
const char* Second(void* buf, size_t n, uint64_t seed) {
  tapp::fill_full(buf, n, seed);
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

}  // namespace

int main(int argc, char** argv) {
  tapp::Args args(argc, argv, {"size", "only"}, {}, kUsage);
  g_size = (args.size("size", 64 << 10) + P - 1) & ~(P - 1);
  const std::string only = args.str("only", "");
  CHECK(cudaMalloc(&g_dev, g_size));
  g_check = static_cast<unsigned char*>(tapp::alloc_aligned(g_size));
  for (const Case& c : kCases) {
    if (!only.empty() && only != c.name) continue;
    const char* r = c.run();
    std::printf("unseen %s %s\n", c.name, r);
    std::fflush(stdout);
  }
  CHECK(cudaFree(g_dev));
  std::printf("UNSEEN done\n");
  return 0;
}
