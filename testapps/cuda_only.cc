// cuda_only.cc: a CUDA program that never registers memory. It sets CUDA up
// (cudaFree(0): cudart asks the driver's getter for its entry points, where a
// preloaded lazypin sets itself up), copies a pageable buffer to the device
// and back, forks a child that allocates, writes and frees memory and exits,
// and reports its SIGTERM and SIGINT dispositions.
// With lazypin preloaded in any mode the output is the same as without, and
// no log file is made: nothing was called that lazypin records.
//
// CLI: cuda_only [--size 4M] [--quick]
// Prints "SIGTERM=<default|other> SIGINT=<default|other>", "CHILD ok" and
// "CUDA_ONLY ok". Exit: 0 ok; 1 CUDA error or a child that did not exit 0;
// 2 data mismatch.
#include "common.h"

#include <signal.h>
#include <sys/wait.h>

namespace {

const char* Disposition(int sig) {
  struct sigaction now;
  if (sigaction(sig, nullptr, &now) != 0) return "unknown";
  return !(now.sa_flags & SA_SIGINFO) && now.sa_handler == SIG_DFL ? "default" : "other";
}

}  // namespace

int main(int argc, char** argv) {
  tapp::Args args(argc, argv, {"size"}, {"quick"},
                  "usage: cuda_only [--size 4M] [--quick]\n");
  const size_t size = args.size("size", args.has("quick") ? (256 << 10) : (4 << 20));
  CHECK(cudaFree(nullptr));
  std::vector<unsigned char> host(size), back(size);
  for (size_t i = 0; i < size; ++i) host[i] = static_cast<unsigned char>(i * 7);
  void* dev = nullptr;
  CHECK(cudaMalloc(&dev, size));
  CHECK(cudaMemcpy(dev, host.data(), size, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(back.data(), dev, size, cudaMemcpyDeviceToHost));
  if (back != host) {
    std::printf("MISMATCH\n");
    return 2;
  }
  std::printf("SIGTERM=%s SIGINT=%s\n", Disposition(SIGTERM), Disposition(SIGINT));
  std::fflush(stdout);
  const pid_t child = fork();
  if (child == 0) {
    for (int i = 0; i < 16; ++i) {
      void* p = std::malloc(size_t{1} << 20);
      if (p != nullptr) std::memset(p, i, size_t{1} << 20);
      std::free(p);
    }
    _exit(0);
  }
  int status = 0;
  if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    std::printf("CHILD failed\n");
    return 1;
  }
  std::printf("CHILD ok\n");
  CHECK(cudaFree(dev));
  std::printf("CUDA_ONLY ok\n");
  return 0;
}
