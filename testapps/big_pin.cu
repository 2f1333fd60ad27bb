// big_pin: the first cudaHostRegister of a big range of fresh anonymous
// memory (an LLM server's CPU KV cache, an offload trainer's pool), and what
// another process's CUDA calls wait meanwhile (GPU benchmark; scripts/bench-h200
// "bigpin" rows).
//
//   big_pin --size 16G [--fault none|touch|populate] [--threads 16]
//           [--madvise-huge] [--repeats 1]
//     mmap's `size` fresh (never touched), optionally madvise(MADV_HUGEPAGE)
//     on it (the program's own choice), optionally faults it in itself with
//     `threads` threads (touch: one byte per page, each thread its own
//     contiguous slice; populate: MADV_POPULATE_WRITE per slice) and then
//     registers it; unregisters and unmaps it. One line per repetition:
//       RESULT app=big_pin size= fault= threads= madvised= fault_us= register_us=
//              total_us= unregister_us= unmap_us= anon_huge_mb= t0_us= t1_us= t2_us= t3_us=
//     t0..t1: fault-in and register; t1..t3: unregister and unmap
//     (CLOCK_MONOTONIC, microseconds, comparable across processes).
//
//   big_pin --probe [--sleep-us 500]
//     the other process: prints READY once CUDA is up, then times
//     cudaMemGetInfo + cudaMalloc(1 MiB) + cudaFree in a loop until its
//     standard input closes; prints
//       PROBE iters= median_us= max_us=
//       SLOW start_us= lat_us=     (each iteration of 200 us or more)
#include <pthread.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace {

const char* kUsage =
    "usage: big_pin --size 16G [--fault none|touch|populate] [--threads 16] [--madvise-huge]\n"
    "               [--repeats 1]\n"
    "       big_pin --probe [--sleep-us 500]\n"
    "First cudaHostRegister of fresh anonymous memory; --probe: another process's calls.\n";

int Probe(long sleep_us) {
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));
  void* warm = nullptr;
  CHECK(cudaMalloc(&warm, 1 << 20));
  CHECK(cudaFree(warm));
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    char buf[64];
    while (fread(buf, 1, sizeof buf, stdin) > 0) {
    }
    stop = true;
  });
  std::printf("READY\n");
  std::fflush(stdout);
  std::vector<std::pair<double, double>> slow;
  std::vector<double> all;
  all.reserve(1 << 20);
  while (!stop) {
    const double t = tapp::now_us();
    size_t free_b = 0, total_b = 0;
    CHECK(cudaMemGetInfo(&free_b, &total_b));
    void* p = nullptr;
    CHECK(cudaMalloc(&p, 1 << 20));
    CHECK(cudaFree(p));
    const double lat = tapp::now_us() - t;
    if (all.size() < all.capacity()) all.push_back(lat);
    if (lat >= 200) slow.emplace_back(t, lat);
    if (sleep_us > 0) usleep(static_cast<useconds_t>(sleep_us));
  }
  reader.join();
  std::vector<double> sorted = all;
  std::sort(sorted.begin(), sorted.end());
  std::printf("PROBE iters=%zu median_us=%.0f max_us=%.0f\n", all.size(),
              sorted.empty() ? 0.0 : sorted[sorted.size() / 2], sorted.empty() ? 0.0 : sorted.back());
  for (const auto& s : slow) std::printf("SLOW start_us=%.0f lat_us=%.0f\n", s.first, s.second);
  return 0;
}

// Faults [p, p + bytes) in with `threads` threads, each on its own slice.
void FaultIn(char* p, size_t bytes, int threads, bool populate) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t huge = size_t{2} << 20;
  const size_t per = ((bytes / threads) + huge - 1) & ~(huge - 1);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    const size_t a = std::min(bytes, t * per), b = std::min(bytes, a + per);
    if (a >= b) break;
    pool.emplace_back([=] {
      if (populate) {
        if (madvise(p + a, b - a, MADV_POPULATE_WRITE) != 0) {
          std::fprintf(stderr, "madvise(MADV_POPULATE_WRITE): %s\n", std::strerror(errno));
          std::exit(1);
        }
        return;
      }
      for (size_t at = a; at < b; at += page) p[at] = 0;
    });
  }
  for (auto& th : pool) th.join();
}

long AnonHugeMb() {
  std::ifstream f("/proc/self/smaps_rollup");
  std::string line;
  while (std::getline(f, line)) {
    long kb;
    if (std::sscanf(line.c_str(), "AnonHugePages: %ld kB", &kb) == 1) return kb >> 10;
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  tapp::Args args(argc, argv, {"size", "fault", "threads", "repeats", "sleep-us"},
                  {"probe", "madvise-huge"}, kUsage);
  if (args.has("probe")) return Probe(args.num("sleep-us", 500));
  const size_t bytes = args.size("size", size_t{1} << 30);
  const std::string fault = args.str("fault", "none");
  const int threads = static_cast<int>(args.num("threads", 16));
  const bool madvised = args.has("madvise-huge");
  const int repeats = static_cast<int>(args.num("repeats", 1));
  if (fault != "none" && fault != "touch" && fault != "populate") args.die("bad --fault " + fault);
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));
  {  // the driver's register path, warm
    void* w = mmap(nullptr, 64 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(cudaHostRegister(w, 64 << 20, cudaHostRegisterDefault));
    CHECK(cudaHostUnregister(w));
    munmap(w, 64 << 20);
  }
  for (int r = 0; r < repeats; ++r) {
    char* p = static_cast<char*>(
        mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    if (p == MAP_FAILED) args.die("mmap failed");
    if (madvised && madvise(p, bytes, MADV_HUGEPAGE) != 0) args.die("madvise(MADV_HUGEPAGE) failed");
    const double t0 = tapp::now_us();
    if (fault != "none") FaultIn(p, bytes, threads, fault == "populate");
    const double tf = tapp::now_us();
    CHECK(cudaHostRegister(p, bytes, cudaHostRegisterDefault));
    const double t1 = tapp::now_us();
    const long huge_mb = AnonHugeMb();
    const double tu = tapp::now_us();
    CHECK(cudaHostUnregister(p));
    const double t2 = tapp::now_us();
    munmap(p, bytes);
    const double t3 = tapp::now_us();
    std::printf("RESULT app=big_pin size=%s fault=%s threads=%d madvised=%d fault_us=%.0f "
                "register_us=%.0f total_us=%.0f unregister_us=%.0f unmap_us=%.0f anon_huge_mb=%ld "
                "t0_us=%.0f t1_us=%.0f t2_us=%.0f t3_us=%.0f\n",
                tapp::size_name(bytes).c_str(), fault.c_str(), fault == "none" ? 0 : threads,
                madvised ? 1 : 0, tf - t0, t1 - tf, t1 - t0, t2 - tu, t3 - t2, huge_mb, t0, t1, tu, t3);
    std::fflush(stdout);
  }
  return 0;
}
