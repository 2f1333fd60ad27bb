// afterfree.cc: what a program sees of memory after it gave it back, and of
// its own mistakes with it. Each mode prints what it observed (codes, errnos,
// sizes; never an address), flushing every line, so a test compares bare and
// shimmed runs line by line and by exit status (a double free aborts).
//
//   afterfree doublefree SIZE   malloc, register, unregister, free, free again
//   afterfree invalidfree       a pooled 1 MiB block; free(p + 8192)
//   afterfree threshold         a pooled 1 MiB block freed; mallopt(M_MMAP_THRESHOLD,
//                               32 MiB); malloc(1 MiB): its usable size
//   afterfree zeroed            mallopt(M_MMAP_THRESHOLD, 128 KiB) (1 MiB blocks are
//                               mmapped, fresh ones read zeros); a pooled 1 MiB block
//                               filled and freed; malloc(1 MiB): usable size, non-zero bytes
//   afterfree mallinfo          mallinfo2's bytes in use before and after a
//                               register/unregister/free cycle of 2 MiB
//   afterfree noreplace         a pooled 1 MiB block freed; mmap(MAP_FIXED_NOREPLACE)
//                               over its pages
//   afterfree memalign          memalign(2 MiB, 1 MiB), register, unregister, free,
//                               three times: the usable size of each
//   afterfree hostcall CALL     cudaMallocHost(4 MiB), cudaFreeHost, then CALL on
//                               the freed block (mprotect, mprotect_none, mincore,
//                               mlock, munlock, msync, madvise, noreplace): rc, errno
//   afterfree uffd WHAT         the program registers its own userfaultfd on
//                               8 MiB it malloc'd: WHAT = deferred (registered,
//                               unregistered before), inuse (registered now; then
//                               unregistered), copied (copied to the device only:
//                               auto-pin's case). Prints the ioctl's rc and errno.
// Exit 0 ok, 1 setup, 3 unexpected CUDA code (hcommon.h).
#include "hcommon.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <malloc.h>
#include <stdarg.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>

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

// malloc'd, touched, registered and unregistered: under defer the pool holds it.
unsigned char* PooledBlock(size_t bytes, int fill) {
  auto* p = static_cast<unsigned char*>(std::malloc(bytes));
  if (p == nullptr) std::exit(1);
  std::memset(p, fill, bytes);
  EXPECT(cudaHostRegister(p, bytes, cudaHostRegisterDefault), 0);
  EXPECT(cudaHostUnregister(p), 0);
  return p;
}

int DoubleFree(size_t bytes) {
  unsigned char* p = PooledBlock(bytes, 0x5a);
  std::free(p);
  say("freed once");
  std::free(p);
  say("freed twice");
  return 0;
}

int InvalidFree() {
  unsigned char* p = PooledBlock(kMiB, 0);
  say("freeing p + 8192");
  std::free(p + 8192);
  say("freed p + 8192");
  return 0;
}

int Threshold() {
  // The first 1 MiB block is mmapped: its free raises glibc's dynamic
  // threshold (lazypin hands it to glibc at once); the second comes from the
  // heap, and is kept.
  std::free(PooledBlock(kMiB, 1));
  std::free(PooledBlock(kMiB, 1));
  say("mallopt=%d", mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024));
  void* q = std::malloc(kMiB);
  say("usable=%zu", malloc_usable_size(q));
  std::free(q);
  return 0;
}

int Zeroed() {
  say("mallopt=%d", mallopt(M_MMAP_THRESHOLD, 128 * 1024));
  std::free(PooledBlock(kMiB, 0x77));
  auto* q = static_cast<unsigned char*>(std::malloc(kMiB));
  size_t nonzero = 0;
  for (size_t i = 0; i < kMiB; ++i) nonzero += q[i] != 0;
  say("usable=%zu nonzero=%zu", malloc_usable_size(q), nonzero);
  std::free(q);
  return 0;
}

int Mallinfo() {
  void* warm = std::malloc(64);  // stdio and CUDA set up first
  EXPECT(cudaFree(nullptr), 0);
  say("mallopt=%d", mallopt(M_MMAP_THRESHOLD, 128 * 1024));  // the 2 MiB block mmapped, kept
  struct mallinfo2 before = mallinfo2();
  std::free(PooledBlock(2 * kMiB, 3));
  struct mallinfo2 after = mallinfo2();
  say("in use: %+lld bytes, mmapped blocks %+lld",
      static_cast<long long>(after.uordblks + after.hblkhd) -
          static_cast<long long>(before.uordblks + before.hblkhd),
      static_cast<long long>(after.hblks) - static_cast<long long>(before.hblks));
  std::free(warm);
  return 0;
}

int NoReplace() {
  say("mallopt=%d", mallopt(M_MMAP_THRESHOLD, 128 * 1024));  // the block mmapped, kept
  unsigned char* p = PooledBlock(kMiB, 2);
  const uintptr_t page = (reinterpret_cast<uintptr_t>(p) + hard::kPage) & ~(hard::kPage - 1);
  std::free(p);
  void* m = mmap(reinterpret_cast<void*>(page), hard::kPage, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  const int err = m == MAP_FAILED ? errno : 0;
  say("noreplace: %s errno=%d", m == MAP_FAILED ? "failed" : "mapped", err);
  if (m != MAP_FAILED) munmap(m, hard::kPage);
  return 0;
}

int Memalign() {
  for (int i = 0; i < 3; ++i) {
    auto* p = static_cast<unsigned char*>(memalign(2 * kMiB, kMiB));
    if (p == nullptr) return 1;
    std::memset(p, 4, kMiB);
    EXPECT(cudaHostRegister(p, kMiB, cudaHostRegisterDefault), 0);
    EXPECT(cudaHostUnregister(p), 0);
    say("memalign %d: usable=%zu aligned=%d", i, malloc_usable_size(p),
        reinterpret_cast<uintptr_t>(p) % (2 * kMiB) == 0);
    std::free(p);
  }
  return 0;
}

int HostCall(const char* call) {
  void* h = nullptr;
  EXPECT(cudaMallocHost(&h, 4 * kMiB), 0);
  std::memset(h, 1, 4 * kMiB);
  EXPECT(cudaFreeHost(h), 0);
  int rc = 0;
  unsigned char vec[16];
  if (std::strcmp(call, "mprotect") == 0) {
    rc = mprotect(h, hard::kPage, PROT_READ | PROT_WRITE);
  } else if (std::strcmp(call, "mprotect_none") == 0) {
    rc = mprotect(h, hard::kPage, PROT_NONE);
  } else if (std::strcmp(call, "mincore") == 0) {
    rc = mincore(h, 16 * hard::kPage, vec);
  } else if (std::strcmp(call, "mlock") == 0) {
    rc = mlock(h, hard::kPage);
  } else if (std::strcmp(call, "munlock") == 0) {
    rc = munlock(h, hard::kPage);
  } else if (std::strcmp(call, "msync") == 0) {
    rc = msync(h, hard::kPage, MS_ASYNC);
  } else if (std::strcmp(call, "madvise") == 0) {
    rc = madvise(h, hard::kPage, MADV_WILLNEED);
  } else if (std::strcmp(call, "noreplace") == 0) {
    void* m = mmap(h, hard::kPage, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    rc = m == MAP_FAILED ? -1 : 0;
    if (m != MAP_FAILED) munmap(m, hard::kPage);
  } else {
    return 1;
  }
  const int err = rc != 0 ? errno : 0;
  say("%s after cudaFreeHost: rc=%d errno=%d", call, rc, err);
  // The next block of that size: allocated and usable as a fresh one.
  void* again = nullptr;
  EXPECT(cudaMallocHost(&again, 4 * kMiB), 0);
  std::memset(again, 2, 4 * kMiB);
  EXPECT(cudaFreeHost(again), 0);
  say("allocated again");
  return 0;
}

int Uffd(const char* what) {
  const size_t bytes = 8 * kMiB;
  auto* p = static_cast<unsigned char*>(std::malloc(bytes));
  if (p == nullptr) return 1;
  std::memset(p, 6, bytes);
  void* dev = nullptr;
  EXPECT(cudaMalloc(&dev, bytes), 0);
  const bool inuse = std::strcmp(what, "inuse") == 0;
  if (std::strcmp(what, "copied") == 0) {
    EXPECT(cudaMemcpy(dev, p, bytes, cudaMemcpyHostToDevice), 0);
  } else {
    EXPECT(cudaHostRegister(p, bytes, cudaHostRegisterDefault), 0);
    EXPECT(cudaMemcpy(dev, p, bytes, cudaMemcpyHostToDevice), 0);
    if (!inuse) EXPECT(cudaHostUnregister(p), 0);
  }
  const int fd = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY));
  if (fd < 0) {
    say("userfaultfd unavailable");
    return 0;
  }
  struct uffdio_api api = {};
  api.api = UFFD_API;
  if (ioctl(fd, UFFDIO_API, &api) != 0) return 1;
  // The page-aligned part of the block (the kernel registers whole pages).
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(p) + hard::kPage - 1) & ~(hard::kPage - 1);
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(hard::kPage - 1);
  struct uffdio_register reg = {};
  reg.range.start = lo;
  reg.range.len = hi - lo;
  reg.mode = UFFDIO_REGISTER_MODE_MISSING;
  const int rc = ioctl(fd, UFFDIO_REGISTER, &reg);
  say("UFFDIO_REGISTER %s: rc=%d errno=%d", what, rc, rc != 0 ? errno : 0);
  if (rc == 0) {
    struct uffdio_range range = reg.range;
    say("UFFDIO_UNREGISTER: rc=%d", ioctl(fd, UFFDIO_UNREGISTER, &range));
  }
  close(fd);
  // The memory works as before: copied, registered again.
  EXPECT(cudaMemcpy(dev, p, bytes, cudaMemcpyHostToDevice), 0);
  if (inuse) EXPECT(cudaHostUnregister(p), 0);
  EXPECT(cudaHostRegister(p, bytes, cudaHostRegisterDefault), 0);
  EXPECT(cudaHostUnregister(p), 0);
  EXPECT(cudaFree(dev), 0);
  std::free(p);
  say("uffd %s done", what);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 1;
  const std::string mode = argv[1];
  EXPECT(cudaFree(nullptr), 0);
  if (mode == "doublefree" && argc > 2) return DoubleFree(std::strtoull(argv[2], nullptr, 0));
  if (mode == "invalidfree") return InvalidFree();
  if (mode == "threshold") return Threshold();
  if (mode == "zeroed") return Zeroed();
  if (mode == "mallinfo") return Mallinfo();
  if (mode == "noreplace") return NoReplace();
  if (mode == "memalign") return Memalign();
  if (mode == "hostcall" && argc > 2) return HostCall(argv[2]);
  if (mode == "uffd" && argc > 2) return Uffd(argv[2]);
  return 1;
}
