// populate_pin: GPU-only benchmark for faster first pins. A
// first cudaHostRegister of fresh malloc'd memory makes the driver fault
// every page in, on the calling thread. Does faulting them in first with N
// threads (madvise(MADV_POPULATE_WRITE) on N chunks: contents unchanged)
// make populate + register faster than the register alone?
//
// For each size, each repetition runs every method once, interleaved, each on
// memory freshly malloc'd (never touched) and freed afterwards:
//   bare      cudaHostRegister alone
//   popN      N threads populate their chunk (threads started inside the
//             timing), then cudaHostRegister
// Output, one line per method and size (medians over --repeats):
//   RESULT app=populate_pin size=<s> method=<m> threads=<n> populate_us= register_us= total_us=
//   plus speedup=<bare total / this total>.
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
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
    "usage: populate_pin [--sizes 64M,1G,4G] [--threads 1,4,8,16] [--repeats 3]\n"
    "First cudaHostRegister of fresh malloc'd memory: bare vs after N threads\n"
    "fault it in with madvise(MADV_POPULATE_WRITE) (GPU only).\n";

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Faults [p, p + bytes) in with `threads` threads, each on one chunk.
// Returns false if the kernel refused (no MADV_POPULATE_WRITE).
bool populate(void* p, size_t bytes, int threads) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + bytes + page - 1) & ~(page - 1);
  const uintptr_t chunk = ((hi - lo) / threads + page - 1) & ~(page - 1);
  std::vector<std::thread> pool;
  std::vector<int> ok(threads, 1);
  for (int t = 0; t < threads; ++t) {
    const uintptr_t a = lo + t * chunk, b = std::min(hi, a + chunk);
    if (a >= b) break;
    pool.emplace_back([a, b, t, &ok] {
      if (madvise(reinterpret_cast<void*>(a), b - a, MADV_POPULATE_WRITE) != 0) ok[t] = 0;
    });
  }
  for (auto& th : pool) th.join();
  return std::all_of(ok.begin(), ok.end(), [](int v) { return v != 0; });
}

struct Sample {
  double populate_us = 0, register_us = 0;
};

Sample run_once(size_t bytes, int threads) {
  void* p = std::malloc(bytes);
  if (p == nullptr) {
    std::fprintf(stderr, "malloc(%zu) failed\n", bytes);
    std::exit(1);
  }
  Sample s;
  const double t0 = tapp::now_us();
  if (threads > 0 && !populate(p, bytes, threads)) {
    std::fprintf(stderr, "madvise(MADV_POPULATE_WRITE) refused: %s\n", std::strerror(errno));
    std::exit(1);
  }
  const double t1 = tapp::now_us();
  CHECK(cudaHostRegister(p, bytes, cudaHostRegisterDefault));
  const double t2 = tapp::now_us();
  s.populate_us = t1 - t0;
  s.register_us = t2 - t1;
  CHECK(cudaHostUnregister(p));
  std::free(p);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  tapp::Args args(argc, argv, {"sizes", "threads", "repeats"}, {}, kUsage);
  const std::vector<size_t> sizes = args.sizes("sizes", "64M,1G,4G");
  std::vector<int> counts = {0};
  for (size_t n : args.sizes("threads", "1,4,8,16")) counts.push_back(static_cast<int>(n));
  const int repeats = static_cast<int>(args.num("repeats", 3));

  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));
  {
    std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string line;
    std::getline(thp, line);
    std::printf("populate_pin: transparent_hugepage=%s cpus=%ld\n", line.c_str(),
                sysconf(_SC_NPROCESSORS_ONLN));
  }
  run_once(64 << 20, 0);  // warm the driver's register path
  for (size_t bytes : sizes) {
    std::vector<std::vector<Sample>> samples(counts.size());
    for (int r = 0; r < repeats; ++r) {
      for (size_t m = 0; m < counts.size(); ++m) samples[m].push_back(run_once(bytes, counts[m]));
    }
    double bare_total = 0;
    for (size_t m = 0; m < counts.size(); ++m) {
      std::vector<double> pop, reg, tot;
      for (const Sample& s : samples[m]) {
        pop.push_back(s.populate_us);
        reg.push_back(s.register_us);
        tot.push_back(s.populate_us + s.register_us);
      }
      const double total = median(tot);
      if (m == 0) bare_total = total;
      std::printf("RESULT app=populate_pin size=%s method=%s threads=%d populate_us=%.0f "
                  "register_us=%.0f total_us=%.0f speedup=%.2f\n",
                  tapp::size_name(bytes).c_str(), counts[m] == 0 ? "bare" : "populate", counts[m],
                  median(pop), median(reg), total, total > 0 ? bare_total / total : 0.0);
      std::fflush(stdout);
    }
  }
  return 0;
}
