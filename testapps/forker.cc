// forker.cc: fork() after registrations, with a child that never calls CUDA.
//
// Scenario (default): register + copy + unregister a page-aligned buffer (with
// lazypin's defer mode the registration stays pooled), then fork(). The child
// frees that buffer, mallocs / writes / frees some memory (small and large,
// so both heap and mmap'd chunks), mmaps and munmaps a region, and exits 0
// (exit(), so atexit handlers run, or _exit() with --child-exit _exit) WITHOUT
// calling CUDA. The parent waits, requires status 0, then registers the buffer
// again, copies it H2D with a new pattern, copies it back, verifies, unregisters.
//   --keep-registered  the buffer is still registered at fork (the parent
//                      unregisters it after the child is gone)
//   --exec             the child execs /bin/true instead (lazypin, inherited
//                      through LD_PRELOAD, loads in a process with no CUDA)
//   --children N       fork N children one after the other (default 1)
//
// CLI: forker [--size 4M] [--children 1] [--keep-registered] [--exec]
//             [--child-exit exit|_exit] [--quick]
//   --quick  --size 256K
// Prints "CHILD pid-status=<status> ok" per child and "FORKER ok".
// Exit: 0 ok; 1 CUDA error or a child that did not exit 0; 2 data mismatch.
#include "common.h"

#include <sys/mman.h>
#include <sys/wait.h>

namespace {

void child_work(unsigned char* buf, bool use_exit) {
  std::free(buf);
  for (int i = 0; i < 64; ++i) {
    size_t n = (i % 2) ? (1 << 20) : 4096 + static_cast<size_t>(i) * 100;
    void* p = std::malloc(n);
    if (p) {
      std::memset(p, i, n);
      std::free(p);
    }
  }
  void* m = mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m != MAP_FAILED) {
    std::memset(m, 1, 1 << 20);
    munmap(m, 1 << 20);
  }
  if (use_exit) std::exit(0);
  _exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  tapp::Args args(argc, argv, {"size", "children", "child-exit"},
                  {"keep-registered", "exec", "quick"},
                  "usage: forker [--size 4M] [--children 1] [--keep-registered] [--exec] "
                  "[--child-exit exit|_exit] [--quick]\n");
  const bool quick = args.has("quick");
  const size_t bytes = args.size("size", quick ? (256 << 10) : (4 << 20));
  const int children = static_cast<int>(args.num("children", 1));
  const bool keep = args.has("keep-registered");
  const bool exec_mode = args.has("exec");
  const std::string child_exit = args.str("child-exit", "exit");
  if (child_exit != "exit" && child_exit != "_exit") args.die("bad --child-exit");
  if (bytes == 0 || children < 1) args.die("bad arguments");

  CHECK(cudaSetDevice(0));
  void* dev = nullptr;
  CHECK(cudaMalloc(&dev, bytes));
  unsigned char* host = static_cast<unsigned char*>(tapp::alloc_aligned(bytes));
  unsigned char* check = static_cast<unsigned char*>(tapp::alloc_aligned(bytes));
  tapp::fill_full(host, bytes, 1);

  for (int c = 0; c < children; ++c) {
    CHECK(cudaHostRegister(host, bytes, 0));
    CHECK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
    if (!keep) CHECK(cudaHostUnregister(host));

    std::fflush(stdout);
    std::fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      return 1;
    }
    if (pid == 0) {
      if (exec_mode) {
        execl("/bin/true", "true", static_cast<char*>(nullptr));
        _exit(127);
      }
      child_work(host, child_exit == "exit");
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) {
      std::perror("waitpid");
      return 1;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::printf("CHILD pid-status=%d FAILED\n", status);
      return 1;
    }
    std::printf("CHILD pid-status=%d ok\n", status);
    std::fflush(stdout);

    if (keep) CHECK(cudaHostUnregister(host));
    tapp::fill_full(host, bytes, 100 + static_cast<uint64_t>(c));
    CHECK(cudaHostRegister(host, bytes, 0));
    CHECK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
    std::memset(check, 0, bytes);
    CHECK(cudaMemcpy(check, dev, bytes, cudaMemcpyDeviceToHost));
    long long off = tapp::first_diff(host, check, bytes);
    if (off >= 0) tapp::data_mismatch("forker", "after child", off);
    CHECK(cudaHostUnregister(host));
  }
  CHECK(cudaFree(dev));
  std::free(host);
  std::free(check);
  std::printf("FORKER ok\n");
  return 0;
}
