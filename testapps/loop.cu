// loop.cu: register / copy / unregister of ONE reused buffer in a loop.
//
// Scenario: the pattern of a program that pins a staging buffer around every
// transfer. For each size, three modes on the same page-aligned buffer:
//   reg       cudaHostRegister + cudaMemcpy H2D + cudaHostUnregister per iteration
//             (also times the register and the unregister calls separately)
//   pinned    buffer registered once outside the loop; the copy alone (the limit)
//   pageable  cudaMemcpy H2D from the unregistered buffer
// Data check: before every iteration the first and last 8 bytes of each 4 KiB
// page get a new tag; every --verify-every iterations and after the last one
// the device buffer is copied back (cudaMemcpy D2H into another buffer) and
// compared with the host buffer. A mismatch prints "DATA MISMATCH" and exits 2.
//
// CLI: loop [--sizes 4K,64K,1M,4M,16M,64M,256M,1G] [--iters N] [--warmup N]
//           [--modes reg,pinned,pageable] [--verify-every K] [--quick]
//   --iters     iterations per size and mode (default: 200 up to 4M, 100 at 16M,
//               50 at 64M, 20 at 256M, 10 at 1G and above)
//   --warmup    warm-up iterations excluded from the statistics (default 3)
//   --quick     sizes 4K,64K,1M, 20 iterations, 2 warm-up (well under 1 s on
//               the simulator)
// Prints a human line per (size, mode) and
//   RESULT app=loop size=<bytes> mode=<reg|pinned|pageable> iters=<n> median_us= p90_us=
//          min_us= mean_us= gbps=<copy GB/s from the median>
//          [reg_us= unreg_us= copy_us=   (mode=reg: medians of each call)]
#include "common.h"

#include <cuda_runtime.h>

#include <string>
#include <vector>

namespace {

const char* kUsage =
    "usage: loop [--sizes 4K,64K,1M,4M,16M,64M,256M,1G] [--iters N] [--warmup N]\n"
    "            [--modes reg,pinned,pageable] [--verify-every K] [--quick]\n";

int default_iters(size_t bytes) {
  if (bytes <= (4u << 20)) return 200;
  if (bytes <= (16u << 20)) return 100;
  if (bytes <= (64u << 20)) return 50;
  if (bytes <= (256u << 20)) return 20;
  return 10;
}

struct Buffers {
  unsigned char* host = nullptr;
  unsigned char* check = nullptr;
  void* dev = nullptr;
  size_t bytes = 0;
};

void verify(const Buffers& b, size_t bytes, const char* mode) {
  CHECK(cudaMemcpy(b.check, b.dev, bytes, cudaMemcpyDeviceToHost));
  long long off = tapp::first_diff(b.host, b.check, bytes);
  if (off >= 0) {
    char what[128];
    std::snprintf(what, sizeof what, "mode=%s size=%zu", mode, bytes);
    tapp::data_mismatch("loop", what, off);
  }
}

void run_mode(const std::string& mode, Buffers& b, int iters, int warmup, int verify_every) {
  const size_t bytes = b.bytes;
  std::vector<double> total, reg, unreg, copy;
  static uint64_t seed = 1;
  ++seed;
  if (mode == "pinned") CHECK(cudaHostRegister(b.host, bytes, 0));
  for (int i = 0; i < warmup + iters; ++i) {
    tapp::stamp_pages(b.host, bytes, seed, static_cast<uint64_t>(i));
    double t0 = tapp::now_us(), t1 = t0, t2, t3;
    if (mode == "reg") {
      CHECK(cudaHostRegister(b.host, bytes, 0));
      t1 = tapp::now_us();
    }
    CHECK(cudaMemcpy(b.dev, b.host, bytes, cudaMemcpyHostToDevice));
    t2 = tapp::now_us();
    t3 = t2;
    if (mode == "reg") {
      CHECK(cudaHostUnregister(b.host));
      t3 = tapp::now_us();
    }
    if (i >= warmup) {
      total.push_back(t3 - t0);
      copy.push_back(t2 - t1);
      if (mode == "reg") {
        reg.push_back(t1 - t0);
        unreg.push_back(t3 - t2);
      }
    }
    if (verify_every > 0 && (i + 1) % verify_every == 0) verify(b, bytes, mode.c_str());
  }
  verify(b, bytes, mode.c_str());
  if (mode == "pinned") CHECK(cudaHostUnregister(b.host));

  tapp::Stats st = tapp::stats(total);
  tapp::Stats sc = tapp::stats(copy);
  double gbps = sc.median > 0 ? static_cast<double>(bytes) / (sc.median * 1e3) : 0;
  std::printf("loop %-6s %-8s iters=%d median=%.1f us p90=%.1f us min=%.1f us copy=%.1f us (%.2f GB/s)",
              tapp::size_name(bytes).c_str(), mode.c_str(), iters, st.median, st.p90, st.min,
              sc.median, gbps);
  if (mode == "reg") {
    tapp::Stats sr = tapp::stats(reg), su = tapp::stats(unreg);
    std::printf(" register=%.1f us unregister=%.1f us", sr.median, su.median);
  }
  std::printf("\n");
  std::printf("RESULT app=loop size=%zu mode=%s iters=%d median_us=%.2f p90_us=%.2f min_us=%.2f "
              "mean_us=%.2f gbps=%.3f",
              bytes, mode.c_str(), iters, st.median, st.p90, st.min, st.mean, gbps);
  if (mode == "reg") {
    tapp::Stats sr = tapp::stats(reg), su = tapp::stats(unreg);
    std::printf(" reg_us=%.2f unreg_us=%.2f copy_us=%.2f", sr.median, su.median, sc.median);
  } else {
    std::printf(" copy_us=%.2f", sc.median);
  }
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  tapp::Args args(argc, argv, {"sizes", "iters", "warmup", "modes", "verify-every"}, {"quick"},
                  kUsage);
  const bool quick = args.has("quick");
  std::vector<size_t> sizes =
      args.sizes("sizes", quick ? "4K,64K,1M" : "4K,64K,1M,4M,16M,64M,256M,1G");
  const int warmup = static_cast<int>(args.num("warmup", quick ? 2 : 3));
  const int verify_every = static_cast<int>(args.num("verify-every", 16));
  std::string modes_s = args.str("modes", "reg,pinned,pageable");
  std::vector<std::string> modes;
  for (size_t pos = 0; pos <= modes_s.size();) {
    size_t c = modes_s.find(',', pos);
    if (c == std::string::npos) c = modes_s.size();
    std::string m = modes_s.substr(pos, c - pos);
    if (m != "reg" && m != "pinned" && m != "pageable") args.die("bad mode: " + m);
    modes.push_back(m);
    pos = c + 1;
  }

  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));  // create the context outside the measurements

  for (size_t bytes : sizes) {
    if (bytes == 0) args.die("size 0");
    int iters = static_cast<int>(args.num("iters", quick ? 20 : default_iters(bytes)));
    if (iters < 1) args.die("--iters must be >= 1");
    Buffers b;
    b.bytes = bytes;
    b.host = static_cast<unsigned char*>(tapp::alloc_aligned(bytes));
    b.check = static_cast<unsigned char*>(tapp::alloc_aligned(bytes));
    tapp::fill_full(b.host, bytes, bytes);
    std::memset(b.check, 0, bytes);
    CHECK(cudaMalloc(&b.dev, bytes));
    for (const std::string& m : modes) run_mode(m, b, iters, warmup, verify_every);
    CHECK(cudaFree(b.dev));
    std::free(b.host);
    std::free(b.check);
  }
  return 0;
}
