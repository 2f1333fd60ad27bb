// sites: call sites that register many different buffers, for the call-site
// tests (tests/preload/test_callsites.py). Knows nothing of lazypin.
//
//   sites [--buffers 64]
// One mapping of 3 * buffers + 2 pages, each page a buffer registered once:
//   1. `buffers` pages registered by one line, in a loop;
//   2. `buffers` pages through one wrapper (Pin), called alternately by
//      FromShallow and FromDeep (which calls Pin with a deeper stack);
//   3. `buffers` pages alternately by two lines (TwoLines);
//   then one page each by two more lines of main;
//   4. one page, then two pages, through Pin from two lines of one function
//      (TwoSizes: the same depth, told apart by the size);
//   every buffer unregistered by one line.
// Prints "sites: <n> registered" and exits 0, or says what failed and exits 1.
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "sites: %s: %d\n", what, static_cast<int>(e));
    std::exit(1);
  }
}

__attribute__((noinline)) void Pin(char* p, size_t n) {
  Check(cudaHostRegister(p, n, 0), "register (Pin)");
  asm volatile("" ::: "memory");  // no tail call: Pin's frame is the register's caller
}

__attribute__((noinline)) void FromShallow(char* p, size_t n) {
  Pin(p, n);
  asm volatile("" ::: "memory");
}

__attribute__((noinline)) void FromDeep(char* p, size_t n) {
  volatile char pad[512];  // a bigger frame: Pin runs deeper than from FromShallow
  pad[0] = 1;
  Pin(p, n);
  asm volatile("" ::: "memory");
  (void)pad[0];
}

__attribute__((noinline)) void TwoLines(char* p, size_t n, bool first) {
  if (first) {
    Check(cudaHostRegister(p, n, 0), "register (first line)");
  } else {
    Check(cudaHostRegister(p, n, 0), "register (second line)");
  }
  asm volatile("" ::: "memory");
}

__attribute__((noinline)) void TwoSizes(char* p, size_t page) {
  Pin(p, page);
  Pin(p + page, 2 * page);
  asm volatile("" ::: "memory");
}

}  // namespace

int main(int argc, char** argv) {
  int buffers = 64;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--buffers") == 0 && i + 1 < argc) {
      buffers = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: sites [--buffers 64]\n");
      return 1;
    }
  }
  if (buffers < 2) buffers = 2;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t pages = 3 * static_cast<size_t>(buffers) + 2 + 3;
  void* map = mmap(nullptr, pages * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) {
    std::perror("sites: mmap");
    return 1;
  }
  char* base = static_cast<char*>(map);
  memset(base, 1, pages * page);
  size_t next = 0;
  for (int i = 0; i < buffers; ++i) {
    Check(cudaHostRegister(base + next++ * page, page, 0), "register (loop)");
  }
  for (int i = 0; i < buffers; ++i) {
    if (i % 2 == 0) {
      FromShallow(base + next++ * page, page);
    } else {
      FromDeep(base + next++ * page, page);
    }
  }
  for (int i = 0; i < buffers; ++i) TwoLines(base + next++ * page, page, i % 2 == 0);
  Check(cudaHostRegister(base + next++ * page, page, 0), "register (main, line a)");
  Check(cudaHostRegister(base + next++ * page, page, 0), "register (main, line b)");
  TwoSizes(base + next * page, page);
  for (size_t i = 0; i < next + 2; ++i) Check(cudaHostUnregister(base + i * page), "unregister");
  munmap(map, pages * page);
  std::printf("sites: %zu registered\n", next + 2);
  return 0;
}
