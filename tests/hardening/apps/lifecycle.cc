// lifecycle.cc: process life events around pooled registrations.
//
//   lifecycle vfork        pooled buffer; vfork + execve(/bin/true), and vfork +
//                          _exit; the parent frees, allocates again, registers, copies
//   lifecycle spawn        posix_spawn(/bin/true) 20 times while another thread
//                          registers / copies / unregisters
//   lifecycle thread-exit  a non-main thread calls exit(0) while another thread
//                          registers / unregisters in a loop
//   lifecycle _exit        pooled buffers, then _exit(0)
//   lifecycle reset        cudaDeviceReset with pooled and with live registrations,
//                          then more registrations; prints every code
// Prints codes and "<MODE> ok". Exit 0 ok, 1 setup, 2 data mismatch, 3 unexpected code.
#include "hcommon.h"

#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include <atomic>
#include <thread>

extern char** environ;

namespace {

const size_t kN = 1 << 20;
void* g_dev = nullptr;
unsigned char* g_check = nullptr;

void setup_cuda() {
  EXPECT(cudaMalloc(&g_dev, kN), 0);
  g_check = static_cast<unsigned char*>(std::malloc(kN));
}

void cycle(unsigned char* p, size_t n, unsigned seed) {
  EXPECT(cudaHostRegister(p, n, 0), 0);
  hard::roundtrip(p, n, g_dev, g_check, seed);
  EXPECT(cudaHostUnregister(p), 0);
}

int wait_ok(pid_t pid, const char* what) {
  int st = 0;
  if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    std::fprintf(stderr, "%s: child status %d\n", what, st);
    return 1;
  }
  return 0;
}

int run_vfork() {
  setup_cuda();
  auto* p = static_cast<unsigned char*>(std::malloc(kN));
  cycle(p, kN, 1);
  for (int i = 0; i < 10; ++i) {
    pid_t pid = vfork();
    if (pid == 0) {
      char* const args[] = {const_cast<char*>("/bin/true"), nullptr};
      execve("/bin/true", args, environ);
      _exit(127);
    }
    if (pid < 0 || wait_ok(pid, "vfork+exec")) return 1;
    pid = vfork();
    if (pid == 0) _exit(0);
    if (pid < 0 || wait_ok(pid, "vfork+_exit")) return 1;
    cycle(p, kN, 2 + i);  // a pool hit under defer: the parent's pool is intact
  }
  std::free(p);
  auto* q = static_cast<unsigned char*>(std::malloc(kN));
  cycle(q, kN, 99);
  std::free(q);
  std::printf("VFORK children=20 ok\n");
  return 0;
}

int run_spawn() {
  setup_cuda();
  std::atomic<bool> stop{false};
  std::atomic<unsigned long> ops{0};
  std::thread t([&] {
    void* dev = nullptr;
    EXPECT(cudaMalloc(&dev, kN), 0);
    auto* check = static_cast<unsigned char*>(std::malloc(kN));
    unsigned i = 0;
    while (!stop) {
      auto* p = static_cast<unsigned char*>(std::malloc(256 * 1024));
      EXPECT(cudaHostRegister(p, 256 * 1024, 0), 0);
      hard::roundtrip(p, 256 * 1024, dev, check, i++);
      EXPECT(cudaHostUnregister(p), 0);
      if (i % 2) std::free(p); else { EXPECT(cudaHostRegister(p, 256 * 1024, 0), 0);
        EXPECT(cudaHostUnregister(p), 0); std::free(p); }
      ops++;
    }
    std::free(check);
  });
  for (int i = 0; i < 20; ++i) {
    pid_t pid;
    char* const args[] = {const_cast<char*>("/bin/true"), nullptr};
    if (posix_spawn(&pid, "/bin/true", nullptr, nullptr, args, environ) != 0) return 1;
    if (wait_ok(pid, "posix_spawn")) return 1;
  }
  stop = true;
  t.join();
  std::printf("SPAWN children=20 ok\n");
  std::fprintf(stderr, "spawn: worker ops=%lu\n", ops.load());
  return 0;
}

int run_thread_exit() {
  setup_cuda();
  std::atomic<unsigned long> ops{0};
  std::thread worker([&] {
    unsigned i = 0;
    for (;;) {
      auto* p = static_cast<unsigned char*>(std::malloc(128 * 1024));
      // Codes are not checked here: exit() may tear CUDA down under us.
      cudaHostRegister(p, 128 * 1024, 0);
      cudaHostUnregister(p);
      if (++i % 3) std::free(p);
      ops++;
    }
  });
  worker.detach();
  while (ops < 200) usleep(100);
  std::printf("THREAD-EXIT exiting from a non-main thread\n");
  std::fflush(stdout);
  std::thread exiter([] { std::exit(0); });
  exiter.join();  // never returns
  return 1;
}

int run_underscore_exit() {
  setup_cuda();
  for (int i = 0; i < 4; ++i) {
    auto* p = static_cast<unsigned char*>(std::malloc(kN));
    cycle(p, kN, static_cast<unsigned>(i));
  }
  std::printf("_EXIT ok\n");
  std::fflush(stdout);
  _exit(0);
}

int run_reset() {
  setup_cuda();
  auto* a = static_cast<unsigned char*>(std::malloc(kN));
  auto* b = static_cast<unsigned char*>(std::malloc(kN));
  auto show = [](const char* what, int rc) {
    std::printf("%-40s -> %d last=%d\n", what, rc, static_cast<int>(cudaGetLastError()));
  };
  show("register a", cudaHostRegister(a, kN, 0));
  show("unregister a (pooled under defer)", cudaHostUnregister(a));
  show("register b", cudaHostRegister(b, kN, 0));
  show("cudaDeviceReset", cudaDeviceReset());
  show("unregister b (dropped by the reset)", cudaHostUnregister(b));
  show("register a after reset", cudaHostRegister(a, kN, 0));
  show("register a again", cudaHostRegister(a, kN, 0));
  show("register b after reset", cudaHostRegister(b, kN, 0));
  void* dev = nullptr;
  show("cudaMalloc after reset", cudaMalloc(&dev, kN));
  std::memset(a, 7, kN);
  show("copy a", cudaMemcpy(dev, a, kN, cudaMemcpyHostToDevice));
  show("unregister a", cudaHostUnregister(a));
  show("unregister b", cudaHostUnregister(b));
  show("register a, third time", cudaHostRegister(a, kN, 0));
  show("unregister a, third time", cudaHostUnregister(a));
  show("cudaDeviceReset, second", cudaDeviceReset());
  show("unregister a after second reset", cudaHostUnregister(a));
  show("register a after second reset", cudaHostRegister(a, kN, 0));
  show("unregister a", cudaHostUnregister(a));
  std::free(a);
  std::free(b);
  std::printf("RESET ok\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  if (!std::strcmp(mode, "vfork")) return run_vfork();
  if (!std::strcmp(mode, "spawn")) return run_spawn();
  if (!std::strcmp(mode, "thread-exit")) return run_thread_exit();
  if (!std::strcmp(mode, "_exit")) return run_underscore_exit();
  if (!std::strcmp(mode, "reset")) return run_reset();
  std::fprintf(stderr, "usage: lifecycle vfork|spawn|thread-exit|_exit|reset\n");
  return 1;
}
