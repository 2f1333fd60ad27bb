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
//   lifecycle clone HOW    a pooled buffer, then a child made without fork's
//                          handlers (HOW: wrapper = glibc's clone() on a stack
//                          of its own, syscall = SYS_clone with SIGCHLD and no
//                          stack, clone3 = SYS_clone3 likewise). The child frees
//                          the pooled buffer, registers / copies / unregisters
//                          another and exits 0 through exit(); the parent waits,
//                          then uses the pooled buffer again
//   lifecycle signal HOW SIG HANDLER WAIT
//                          a child (HOW: fork, or a clone HOW as above) that
//                          loops in pause() gets SIG (TERM or INT) from its
//                          parent; HANDLER: none, early (the program's handler,
//                          installed before the first CUDA call, i.e. before
//                          lazypin set up) or late (installed after); WAIT:
//                          ready (the child said so through a pipe) or now
//                          (right after the child was made). Prints the raw
//                          wait status.
// Prints codes and "<MODE> ok". Exit 0 ok, 1 setup, 2 data mismatch, 3 unexpected code.
#include "hcommon.h"

#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/syscall.h>
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

// A child process made without fork's (pthread_atfork) handlers, running
// `body`, which returns the child's exit code (then the child calls exit()
// with it; glibc's clone() would _exit). Returns the child's pid, or -1.
struct ChildCall {
  int (*body)(void*);
  void* arg;
};
ChildCall g_child_call;
int exit_with_body(void*) { std::exit(g_child_call.body(g_child_call.arg)); }

pid_t clone_child(const char* how, int (*body)(void*), void* arg) {
  std::fflush(stdout);
  g_child_call = {body, arg};
  if (!std::strcmp(how, "wrapper")) {
    const size_t kStack = 1 << 20;
    void* stack = mmap(nullptr, kStack, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (stack == MAP_FAILED) return -1;
    return clone(exit_with_body, static_cast<char*>(stack) + kStack, SIGCHLD, nullptr);
  }
  long pid = -1;
  if (!std::strcmp(how, "syscall")) {
    pid = syscall(SYS_clone, SIGCHLD, nullptr, nullptr, nullptr, 0);
  } else if (!std::strcmp(how, "clone3")) {
    struct clone_args args;
    std::memset(&args, 0, sizeof args);
    args.exit_signal = SIGCHLD;
    pid = syscall(SYS_clone3, &args, sizeof args);
  }
  if (pid == 0) std::exit(body(arg));
  return static_cast<pid_t>(pid);
}

unsigned char* g_pooled = nullptr;

int clone_body(void*) {
  // A new buffer (not from malloc: a thread of the parent may have held
  // malloc's lock), then the parent's pooled buffer freed (an mmap'd chunk:
  // glibc's free takes no lock for it). The new buffer is mapped first: the
  // simulated driver's table, copied from the parent, still holds lazypin's
  // pooled registration there (a real driver is not usable in a child).
  auto* q = static_cast<unsigned char*>(
      mmap(nullptr, kN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (q == MAP_FAILED) std::exit(1);
  std::free(g_pooled);
  int codes[5];
  codes[0] = cudaHostRegister(q, kN, 0);
  codes[1] = cudaMemcpy(g_dev, q, kN, cudaMemcpyHostToDevice);
  codes[2] = cudaHostUnregister(q);
  codes[3] = cudaHostRegister(q, kN, 0);  // 0: the unregister above really happened
  codes[4] = cudaHostUnregister(q);
  munmap(q, kN);
  std::printf("child: register=%d copy=%d unregister=%d register=%d unregister=%d\n", codes[0],
              codes[1], codes[2], codes[3], codes[4]);
  for (int code : codes) {
    if (code != 0) std::exit(1);
  }
  std::exit(0);  // atexit handlers run in the child (lazypin's among them)
}

int run_clone(const char* how) {
  setup_cuda();
  g_pooled = static_cast<unsigned char*>(std::malloc(kN));
  cycle(g_pooled, kN, 1);  // pooled under defer
  usleep(20000);           // lazypin's threads idle (none holds malloc's lock)
  for (int i = 0; i < 3; ++i) {
    const pid_t pid = clone_child(how, clone_body, nullptr);
    if (pid < 0) {
      std::perror("clone");
      return 1;
    }
    if (wait_ok(pid, how)) return 1;
    cycle(g_pooled, kN, 2 + i);  // the parent's pool still works (a hit under defer)
  }
  std::free(g_pooled);
  auto* q = static_cast<unsigned char*>(std::malloc(kN));
  cycle(q, kN, 99);
  std::free(q);
  std::printf("CLONE %s children=3 ok\n", how);
  return 0;
}

int g_ready_fd = -1;

void on_signal(int sig) {
  char line[] = "child handler: signal NN\n";
  line[22] = static_cast<char>('0' + sig / 10);
  line[23] = static_cast<char>('0' + sig % 10);
  if (write(1, line, sizeof line - 1) < 0) _exit(98);
  _exit(40 + sig);
}

int signal_body(void*) {
  if (write(g_ready_fd, "r", 1) != 1) return 97;
  for (;;) pause();
}

void install(int sig) {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(sig, &sa, nullptr);
}

int run_signal(const char* how, const char* sig_name, const char* handler, const char* when) {
  const int sig = !std::strcmp(sig_name, "INT") ? SIGINT : SIGTERM;
  if (!std::strcmp(handler, "early")) install(sig);
  setup_cuda();
  auto* p = static_cast<unsigned char*>(std::malloc(kN));
  cycle(p, kN, 1);  // lazypin set up (and, under defer, p pooled)
  if (!std::strcmp(handler, "late")) install(sig);
  int ready[2];
  if (pipe(ready) != 0) return 1;
  g_ready_fd = ready[1];
  std::fflush(stdout);
  pid_t pid;
  if (!std::strcmp(how, "fork")) {
    pid = fork();
    if (pid == 0) _exit(signal_body(nullptr));
  } else {
    pid = clone_child(how, signal_body, nullptr);
  }
  if (pid < 0) return 1;
  char c;
  if (!std::strcmp(when, "ready") && read(ready[0], &c, 1) != 1) return 1;
  kill(pid, sig);
  int st = 0;
  if (waitpid(pid, &st, 0) != pid) return 1;
  std::printf("child %s SIG%s handler=%s: status=%d signaled=%d termsig=%d exited=%d code=%d\n",
              how, sig_name, handler, st, WIFSIGNALED(st), WIFSIGNALED(st) ? WTERMSIG(st) : 0,
              WIFEXITED(st), WIFEXITED(st) ? WEXITSTATUS(st) : 0);
  cycle(p, kN, 2);
  std::free(p);
  std::printf("SIGNAL ok\n");
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
  if (!std::strcmp(mode, "clone") && argc == 3) return run_clone(argv[2]);
  if (!std::strcmp(mode, "signal") && argc == 6) return run_signal(argv[2], argv[3], argv[4], argv[5]);
  std::fprintf(stderr, "usage: lifecycle vfork|spawn|thread-exit|_exit|reset|clone HOW|"
                       "signal HOW SIG HANDLER WAIT\n");
  return 1;
}
