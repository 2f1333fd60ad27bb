// confined: a CUDA program in unusual surroundings, printing what it saw, so
// that a run under lazypin can be compared with a bare one (test_confined.py).
//   confined fiber <unmapped|data|code|guard>
//       registers from a makecontext fiber whose outermost return address is
//       bogus (an unmapped address, heap data, the middle of a function) or
//       whose stack ends at a PROT_NONE page
//   confined seccomp <userfaultfd|set_mempolicy|get_mempolicy|madvise> <early|late>
//       installs a seccomp filter that kills the process on that system
//       call, before CUDA starts (early) or after its first register (late),
//       then registers 64 MiB buffers
//   confined protect <none|read>
//       registers 96 MiB of fresh memory with one PROT_NONE (or read-only)
//       page at 24 MiB: refused; prints what was faulted in past that page
//   confined nofile <early|late>
//       lowers RLIMIT_NOFILE to 64 before CUDA starts (early) or after its
//       first register (late), then opens /dev/null until EMFILE
#include "hcommon.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <ucontext.h>

#include <vector>

namespace {

using hard::kPage;

// One register, copy, unregister round of `bytes`; prints the codes.
void Round(const char* label, size_t bytes) {
  void* dev = nullptr;
  EXPECT(cudaMalloc(&dev, 1 << 20), 0);
  void* host = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (host == MAP_FAILED) {
    perror("mmap");
    std::exit(4);
  }
  const int reg = cudaHostRegister(host, bytes, 0);
  static_cast<unsigned char*>(host)[0] = 7;
  const int copy = cudaMemcpy(dev, host, 1 << 20, cudaMemcpyHostToDevice);
  const int unreg = cudaHostUnregister(host);
  const int again = cudaHostRegister(host, bytes, 0);
  const int unreg2 = cudaHostUnregister(host);
  std::printf("%s: register=%d copy=%d unregister=%d register=%d unregister=%d\n", label, reg, copy,
              unreg, again, unreg2);
  munmap(host, bytes);
  EXPECT(cudaFree(dev), 0);
}

// ----------------------------------------------------------------- fiber --
ucontext_t g_main, g_fiber;
const char* g_kind = "";

void FiberBody() {
  Round(g_kind, 1 << 20);
  swapcontext(&g_fiber, &g_main);  // never returns through the bogus address
}

int Fiber(const char* kind) {
  g_kind = kind;
  EXPECT(cudaFree(nullptr), 0);
  const size_t stack_bytes = 256 << 10;
  // The stack ends right below a PROT_NONE page: a read past its top faults.
  char* map = static_cast<char*>(mmap(nullptr, stack_bytes + kPage, PROT_READ | PROT_WRITE,
                                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (map == MAP_FAILED) return 4;
  mprotect(map + stack_bytes, kPage, PROT_NONE);
  getcontext(&g_fiber);
  g_fiber.uc_stack.ss_sp = map;
  g_fiber.uc_stack.ss_size = stack_bytes;
  g_fiber.uc_link = nullptr;
  makecontext(&g_fiber, FiberBody, 0);
  // makecontext put the return address of FiberBody (glibc's __start_context,
  // whose unwind entry ends the stack) at the fiber's stack pointer.
  uintptr_t* ret = reinterpret_cast<uintptr_t*>(g_fiber.uc_mcontext.gregs[REG_RSP]);
  static std::vector<unsigned char> heap(4096, 0x5a);
  if (std::strcmp(kind, "unmapped") == 0) {
    *ret = 0x1234;
  } else if (std::strcmp(kind, "data") == 0) {
    *ret = reinterpret_cast<uintptr_t>(heap.data() + 64);
  } else if (std::strcmp(kind, "code") == 0) {
    *ret = reinterpret_cast<uintptr_t>(&std::printf) + 9;  // a function's middle: its unwind entry, wrong stack
  } else if (std::strcmp(kind, "guard") == 0) {
    // The return address in the stack's last word: the bogus frame's stack
    // pointer is the guard page, where its unwind entry reads.
    uintptr_t* top = reinterpret_cast<uintptr_t*>(map + stack_bytes) - 1;
    *top = reinterpret_cast<uintptr_t>(&std::printf) + 9;
    g_fiber.uc_mcontext.gregs[REG_RSP] = reinterpret_cast<greg_t>(top);
  } else {
    return 5;
  }
  swapcontext(&g_main, &g_fiber);
  std::printf("fiber %s: back\n", kind);
  return 0;
}

// --------------------------------------------------------------- seccomp --
void KillOn(long nr) {
  struct sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<unsigned>(nr), 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
      prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
    perror("seccomp");
    std::exit(4);
  }
}

int Seccomp(const char* call, const char* when) {
  long nr = -1;
  if (std::strcmp(call, "userfaultfd") == 0) nr = SYS_userfaultfd;
  if (std::strcmp(call, "set_mempolicy") == 0) nr = SYS_set_mempolicy;
  if (std::strcmp(call, "get_mempolicy") == 0) nr = SYS_get_mempolicy;
  if (std::strcmp(call, "madvise") == 0) nr = SYS_madvise;
  if (nr < 0) return 5;
  const bool early = std::strcmp(when, "early") == 0;
  if (early) KillOn(nr);
  Round("first 1 MiB", 1 << 20);
  if (!early) KillOn(nr);
  Round("64 MiB", 64 << 20);
  Round("96 MiB", 96 << 20);
  std::printf("seccomp %s %s: alive\n", call, when);
  return 0;
}

// --------------------------------------------------------------- protect --
int Protect(const char* how) {
  EXPECT(cudaFree(nullptr), 0);
  const size_t bytes = 96 << 20, guard = 24 << 20;
  char* p = static_cast<char*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  if (p == MAP_FAILED) return 4;
  const int prot = std::strcmp(how, "read") == 0 ? PROT_READ : PROT_NONE;
  if (mprotect(p + guard, kPage, prot) != 0) return 4;
  const int reg = cudaHostRegister(p, bytes, 0);
  cudaGetLastError();
  // Pages faulted in past the protected one (mincore: resident or not).
  const size_t after = bytes - guard - kPage;
  std::vector<unsigned char> vec(after / kPage);
  if (mincore(p + guard + kPage, after, vec.data()) != 0) return 4;
  size_t resident = 0;
  for (unsigned char v : vec) resident += v & 1;
  std::printf("protect %s: register=%d resident_past_it_mib=%zu\n", how, reg, resident * kPage >> 20);
  if (reg == 0) cudaHostUnregister(p);
  munmap(p, bytes);
  return 0;
}

// ---------------------------------------------------------------- nofile --
void LowerLimit() {
  struct rlimit limit = {64, 64};
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    perror("setrlimit");
    std::exit(4);
  }
}

int Nofile(const char* when) {
  const bool early = std::strcmp(when, "early") == 0;
  if (early) LowerLimit();
  Round("first", 1 << 20);
  // lazypin's log writer creates its file after the first record, on its own
  // thread: "late" means after that, so give it the time (a loaded machine).
  if (!early) usleep(500000);
  if (!early) LowerLimit();
  Round("second", 4 << 20);
  usleep(100000);  // lazypin's log writer has written what it had
  std::vector<int> fds;
  for (;;) {
    const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno != EMFILE) std::printf("open: %s\n", strerror(errno));
      break;
    }
    fds.push_back(fd);
  }
  for (int fd : fds) close(fd);
  std::printf("nofile %s: opened=%zu\n", when, fds.size());
  Round("after", 1 << 20);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc >= 3 && std::strcmp(argv[1], "fiber") == 0) return Fiber(argv[2]);
  if (argc >= 4 && std::strcmp(argv[1], "seccomp") == 0) return Seccomp(argv[2], argv[3]);
  if (argc >= 3 && std::strcmp(argv[1], "protect") == 0) return Protect(argv[2]);
  if (argc >= 3 && std::strcmp(argv[1], "nofile") == 0) return Nofile(argv[2]);
  std::fprintf(stderr, "usage: confined fiber|seccomp|protect|nofile ...\n");
  return 2;
}
