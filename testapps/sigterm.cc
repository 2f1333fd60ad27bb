// sigterm.cc: registers and unregisters in a loop until killed, so that a test
// can SIGTERM (or SIGINT / SIGKILL) it in the middle of the loop and check that
// a preloaded lazypin neither hangs nor crashes on the way out.
//
// Scenario: a page-aligned buffer (--size, 1 MiB) and a device buffer; each
// iteration: cudaHostRegister, cudaMemcpy H2D, cudaHostUnregister (with
// lazypin's defer mode, the registration is pooled when the signal lands).
// After --ready-after iterations (default 3) it prints "READY" (flushed). By
// default no signal handler is installed: the signal's default action ends the
// process (no atexit, no destructors). With --graceful a SIGTERM/SIGINT handler
// sets a flag, the loop stops, the program prints "EXIT iterations=<n>" and
// returns 0 from main (atexit handlers and destructors run).
//
// CLI: sigterm [--size 1M] [--sleep-us 0] [--ready-after 3] [--max-seconds 0 (forever)]
//              [--graceful] [--quick]
//   --quick  --size 64K (it still loops until killed, or --max-seconds)
// Prints "READY", and with --graceful (or when --max-seconds ends the loop)
// "EXIT iterations=<n>". Exit: 0 on a graceful stop, 1 on a CUDA error.
#include "common.h"

#include <signal.h>

#include <atomic>

namespace {

volatile sig_atomic_t g_stop = 0;

void on_signal(int) { g_stop = 1; }

}  // namespace

int main(int argc, char** argv) {
  tapp::Args args(argc, argv, {"size", "sleep-us", "ready-after", "max-seconds"},
                  {"graceful", "quick"}, "usage: sigterm [--size 1M] [--sleep-us 0] [--ready-after 3] "
                                         "[--max-seconds 0] [--graceful] [--quick]\n");
  const bool quick = args.has("quick");
  const size_t bytes = args.size("size", quick ? (64 << 10) : (1 << 20));
  const long long sleep_us = args.num("sleep-us", 0);
  const long long ready_after = args.num("ready-after", 3);
  const double max_seconds = args.real("max-seconds", 0);
  if (bytes == 0) args.die("bad --size");

  if (args.has("graceful")) {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
  }

  CHECK(cudaSetDevice(0));
  void* dev = nullptr;
  CHECK(cudaMalloc(&dev, bytes));
  unsigned char* host = static_cast<unsigned char*>(tapp::alloc_aligned(bytes));
  std::memset(host, 0x42, bytes);

  const double end = max_seconds > 0 ? tapp::now_us() + max_seconds * 1e6 : 0;
  long long it = 0;
  while (!g_stop) {
    if (end > 0 && tapp::now_us() >= end) break;
    CHECK(cudaHostRegister(host, bytes, 0));
    CHECK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
    CHECK(cudaHostUnregister(host));
    ++it;
    if (it == ready_after || (ready_after <= 0 && it == 1)) {
      std::printf("READY\n");
      std::fflush(stdout);
    }
    if (sleep_us > 0) usleep(static_cast<useconds_t>(sleep_us));
  }
  std::printf("EXIT iterations=%lld\n", it);
  std::fflush(stdout);
  CHECK(cudaFree(dev));
  std::free(host);
  return 0;
}
